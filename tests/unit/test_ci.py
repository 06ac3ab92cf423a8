"""CI runs exactly the test command the README gives, and prints its slowest tests."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    command = next(
        line
        for line in readme.splitlines()
        if line.startswith("python3 -m venv") and "pytest" in line
    )
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_ci_prints_the_25_slowest_tests() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    readme_command = next(
        i for i, line in enumerate(lines) if line.startswith("python3 -m venv") and "pytest" in line
    )
    exported = [i for i, line in enumerate(lines) if line.startswith("export PYTEST_ADDOPTS=")]
    assert exported and exported[0] < readme_command, "PYTEST_ADDOPTS set after the tests ran"
    assert "--durations=25" in lines[exported[0]]
