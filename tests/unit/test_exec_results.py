"""The one assembly of a command's result (``infra.exec.results``): output redacted as it
comes, then capped; head and tail on an executor, the head only on a bridge."""

from __future__ import annotations

from contracts import replies as rp
from core.secrets import Secrets
from infra.exec.results import Output, command_result
from infra.exec.sandbox import Outcome

SECRET = "sk-live-0123456789abcdef"
SECRETS = Secrets({"openai": SECRET})
NO_CHANGES = rp.CapturedChanges(
    base_version=1, committed=False, version=1, paths=[], total=0, conflicts=[], skipped=[],
    ignored=[],
)  # fmt: skip


def ran(output: Output, chunks: list[bytes]) -> rp.CommandResult:
    for chunk in chunks:
        output.feed("stdout", chunk)
    total = sum(map(len, chunks))
    outcome = Outcome(0, b"".join(chunks)[: 10**6], b"", total, 0, False, 1)
    output.finish(outcome)
    return command_result(outcome, output, NO_CHANGES)


def test_a_secret_split_across_chunks_is_redacted_in_head_and_tail() -> None:
    half = len(SECRET) // 2
    chunks = [b"a" * 10 + SECRET[:half].encode(), SECRET[half:].encode() + b"\n" + b"b" * 500]
    chunks += [b"c" * 500 + SECRET.encode() + b"\n"]
    result = ran(Output(200, SECRETS), chunks)
    assert result.stdout.startswith("a" * 10 + "[REDACTED:openai]\n")
    assert result.stdout_tail.endswith("[REDACTED:openai]\n")
    assert result.stdout_truncated and result.stdout_omitted_bytes > 0


def test_head_only_is_cut_after_redaction_and_never_inside_a_character() -> None:
    output = Output(20, SECRETS, head_only=True)
    result = ran(output, [b"x" * 5 + SECRET.encode() + "é".encode() * 20])
    assert result.stdout == "xxxxx[REDACTED:opena"  # the cap cuts the marker, never the secret
    assert result.stdout_truncated and result.stdout_tail == ""
    assert result.stdout_omitted_bytes == 0 and output.redacted == {"openai"}
    cut = ran(Output(6, head_only=True), ["aéé".encode()])  # 5 bytes: whole, not cut
    assert cut.stdout == "aéé" and not cut.stdout_truncated
    cut = ran(Output(4, head_only=True), ["aéé".encode()])  # the second é cut: dropped
    assert cut.stdout == "aé" and cut.stdout_truncated
