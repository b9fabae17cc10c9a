"""What `verify` returns: per-check results, precise failures, and the JSON form of both."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from packer.errors import EXIT_FAILURE, PackerError

# Failures kept per check (in `failures` and `--json`); `failure_count` says how many there were
# in all, and `failures_omitted` how many of them are not listed.
MAX_LISTED = 1000


class VerificationFailed(PackerError):
    """Raised by callers that want an exception instead of a `VerifyResult` with ok=False."""

    exit_code = EXIT_FAILURE


@dataclass
class Failure:
    message: str  # one line naming the place and what differs
    shard: str | None = None
    row: int | None = None
    sample: int | None = None
    sample_offset: int | None = None
    segment: int | None = None
    check: str = ""  # set by `CheckResult.fail`: the name of the check that holds it

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "check"}
        return {"check": self.check, **out}


@dataclass
class CheckResult:
    name: str
    ran: bool = True
    details: dict = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    failure_count: int = 0
    skipped_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure_count == 0

    def fail(self, failure: Failure) -> None:
        failure.check = self.name
        self.failure_count += 1
        if len(self.failures) < MAX_LISTED:
            self.failures.append(failure)

    def to_dict(self) -> dict:
        out = {
            "ok": self.ok if self.ran else None,  # a check that did not run did not pass
            "ran": self.ran,
            **self.details,
            "failure_count": self.failure_count,
            "failures_omitted": self.failure_count - len(self.failures),
            "failures": [f.to_dict() for f in self.failures],
        }
        if self.skipped_reason:
            out["skipped_reason"] = self.skipped_reason
        return out


@dataclass
class VerifyResult:
    output: str
    checks: dict[str, CheckResult]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    @property
    def failures(self) -> list[Failure]:
        return [f for c in self.checks.values() for f in c.failures]

    @property
    def failure_count(self) -> int:
        return sum(c.failure_count for c in self.checks.values())

    @property
    def failures_listed(self) -> int:
        """How many failures `failures` (and `--json`) hold: all, up to MAX_LISTED per check."""
        return len(self.failures)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "output": self.output,
            "seconds": round(self.seconds, 3),
            "failure_count": self.failure_count,
            "failures_listed": self.failures_listed,
            "not_run": [name for name, c in self.checks.items() if not c.ran],
            "checks": {name: c.to_dict() for name, c in self.checks.items()},
        }

    def raise_for_failure(self) -> None:
        if not self.ok:
            first = self.failures[0].message if self.failures else "a check failed"
            more = self.failure_count - 1
            raise VerificationFailed(first + (f" (and {more} more)" if more > 0 else ""))
