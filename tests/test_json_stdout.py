"""A --json command's stdout is its document alone, whatever else writes to file descriptor 1:
Python prints, a C-level write (Ray's core), and output that comes after the command is done
(Ray's log thread relaying a raylet's lines to the driver)."""

import argparse
import json
import subprocess
import sys
import textwrap

from copus.cli import _json_stdout

NOISY_COMMAND = textwrap.dedent(
    """
    import argparse, os
    from copus.cli import _json_stdout

    args = argparse.Namespace(json=True, process_entry={keep})
    with _json_stdout(args) as print_json:
        print("a progress line")
        os.write(1, b"a line the C++ core writes\\n")
        print_json({{"policy": "static", "steps": 3}}, indent=2)
    print("late, from Python")
    os.write(1, b"late, from a raylet's log\\n")
    """
)


def _run_noisy(keep: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NOISY_COMMAND.format(keep=keep)], capture_output=True, text=True, check=True
    )


def test_a_copus_process_keeps_its_stdout_to_the_document_even_after_it():
    done = _run_noisy(keep=True)
    assert json.loads(done.stdout) == {"policy": "static", "steps": 3}
    for line in ("a progress line", "a line the C++ core writes", "late, from Python", "late, from a raylet's log"):
        assert line in done.stderr


def test_called_from_python_stdout_is_given_back_after_the_command():
    done = _run_noisy(keep=False)
    document, _, after = done.stdout.partition("}\n")
    assert json.loads(document + "}") == {"policy": "static", "steps": 3}
    assert after == "late, from Python\nlate, from a raylet's log\n"
    assert "a line the C++ core writes" in done.stderr and "a progress line" in done.stderr


def test_a_captured_stdout_gets_the_document(capsys):
    with _json_stdout(argparse.Namespace(json=True)) as print_json:
        print("progress")
        print_json({"ok": True})
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": True}
    assert "progress" in err


def test_without_json_the_document_goes_to_stdout_as_it_is(capsys):
    with _json_stdout(argparse.Namespace(json=False)) as print_json:
        print_json({"ok": True})
    assert json.loads(capsys.readouterr().out) == {"ok": True}
