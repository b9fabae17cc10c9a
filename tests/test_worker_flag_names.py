"""A message built in a tokenize worker names the CLI's flags when the driver does: a spawned
worker starts without the CLI's context (`flag_names`), so an error raised there named the
library's parameter (`train_on all`) under the CLI, depending on how the pool was started."""

import multiprocessing

import pytest

from packer.errors import flag_names, option
from packer.tokenize.pool import WorkerPool


def _nothing():
    pass


def _named(parameter):
    return option(parameter)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("cli", [True, False])
def test_a_worker_names_options_as_its_driver_does(method, cli):
    context = multiprocessing.get_context(method)
    with flag_names(cli):
        pool = WorkerPool(context, 1, _named, _nothing, ())
    try:
        got = pool.result(pool.submit(("train_on",), "a task"))
    finally:
        pool.close()
    assert got == ("--train-on" if cli else "train_on")
