"""The documentation's commands and links stay valid.

Every shell line in a fenced code block of README.md and docs/*.md that runs `copus` must parse
with the CLI's own argparse parser; when it names an experiment YAML, a comparison suite or a
simulation YAML of this repository, that file must load with the line's `--set` overrides, so a
configuration the CLI would refuse fails here rather than in a reader's terminal. Every CLI
command must appear in at least one such line. Every relative link must resolve to a file, and
a `#anchor` to a heading of the page it points at. No training, no Ray: seconds.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from copus.cli import build_parser
from copus.config import ConfigError, apply_overrides, is_suite_file, load_config, load_suite, read_yaml
from copus.sim.config import load_sim_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"", "sh", "bash", "shell", "console", "zsh"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
COMMAND_START = {"--", "&&", "||", ";", "|", "time", "nohup", "exec"}  # what may precede a command
# Not a literal command: <id>, KEY=..., ellipses, usage brackets, shell variables other than $PWD.
PLACEHOLDER = re.compile(r"<[^<>\s]*>|\.\.\.|…|^\[|\$")
SHELL_OPERATOR = re.compile(r"^(\|\|?|&&?|;|\d*[<>].*)$")
# Fields naming inputs that an earlier command makes (a model export, a tokenizer, a corpus):
# absent from a checkout, they cannot be validated here.
MADE_ELSEWHERE = ("workload.init_from", "workload.tokenizer", "workload.dataset.path", "workload.dataset.val_path")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(text: str):
    """(language, [(line number, line)]) of every fenced code block of a Markdown page."""
    block, fence = None, None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, block = m.group(1), (m.group(2).lower(), [])
        elif m and m.group(1).startswith(fence[0]) and len(m.group(1)) >= len(fence) and not m.group(2):
            yield block
            fence, block = None, None
        else:
            block[1].append((number, line))


def shell_lines(page: Path):
    """(line number, logical line) of every shell line in the page's shell code blocks:
    continuations joined, here-document bodies left out."""
    for lang, lines in fenced_blocks(page.read_text()):
        if lang not in SHELL_FENCES:
            continue
        heredoc, parts, start = None, [], 0
        for number, line in lines:
            if heredoc:
                heredoc = None if line.strip() == heredoc else heredoc
                continue
            if not parts:
                start = number
            body = line.rstrip()
            parts.append(body[:-1] if body.endswith("\\") else body)
            if body.endswith("\\"):
                continue
            logical = re.sub(r"^\s*\$\s+", "", " ".join(p.strip() for p in parts))
            parts = []
            m = HEREDOC.search(logical)
            heredoc = m.group(1) if m else None
            yield start, logical


@dataclass(frozen=True)
class DocCommand:
    page: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{rel(self.page)}:{self.line}: {self.text.strip()}"

    def argv(self) -> list[str] | None:
        """The arguments after `copus`, up to a shell operator; None for a line with placeholders."""
        text = self.text.replace("${PWD}", str(ROOT)).replace("$PWD", str(ROOT))
        tokens = shlex.split(text, comments=True)
        argv = []
        for token in tokens[copus_at(tokens) + 1 :]:
            if SHELL_OPERATOR.match(token):
                break
            argv.append(token)
        return None if any(PLACEHOLDER.search(t) for t in argv) else argv


def copus_at(tokens: list[str]) -> int | None:
    """Where `copus` (or `.venv/bin/copus`) runs as a command in a shell line's tokens: first,
    after environment assignments, or after `--` (`ray job submit ... -- copus run ...`)."""
    start = True
    for i, token in enumerate(tokens):
        if start and (token == "copus" or token.endswith("/copus")):
            return i
        start = token in COMMAND_START or (start and re.match(r"^[A-Za-z_]\w*=", token) is not None)
    return None


def doc_commands() -> list[DocCommand]:
    found = []
    for page in PAGES:
        for line, text in shell_lines(page):
            try:
                tokens = shlex.split(text, comments=True)
            except ValueError:  # unbalanced quotes: not a line this test can read
                tokens = ["copus"] if re.search(r"(^|[\s/])copus\s", text.split("#")[0]) else []
            if copus_at(tokens) is not None:
                found.append(DocCommand(page, line, text))
    return found


COMMANDS = doc_commands()


def parse(argv: list[str]):
    """The CLI parser's Namespace, or the failure with argparse's own message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv)
    except SystemExit as exit_:
        if exit_.code == 0:  # --help
            return None
        pytest.fail(f"the CLI refuses the arguments: {err.getvalue().strip().splitlines()[-1]}")


def made_elsewhere(err: ConfigError, path: str, overrides: list[str], suite: bool) -> str | None:
    """The missing input behind a refusal, when it is one an earlier command makes (an absolute
    path, or one under runs/, the outputs folder); None for any other refusal."""
    raw = read_yaml(path)
    if suite:
        overrides = list(raw.get("set") or []) + overrides
        experiment = raw["experiment"]
        raw = experiment if isinstance(experiment, dict) else read_yaml(Path(path).parent / experiment)
    raw = apply_overrides(raw, overrides)
    for field in MADE_ELSEWHERE:
        if not re.search(rf"(^|\s){re.escape(field)}: ", str(err)) or "not found" not in str(err):
            continue
        node = raw
        for part in field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and (Path(node).is_absolute() or Path(node).parts[:1] == ("runs",)):
            return f"{field}: {node}"
    return None


def test_the_docs_have_commands_for_every_cli_command():
    commands = {a.dest: a for a in build_parser()._actions if a.dest == "command"}["command"].choices
    documented = {argv[0] for c in COMMANDS if (argv := c.argv())}
    assert COMMANDS, "no `copus` command found in any fenced code block"
    assert sorted(set(commands) - documented) == [], "CLI commands without a literal example in the docs"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{rel(c.page)}:{c.line}")
def test_documented_command_is_valid(command: DocCommand, monkeypatch):
    monkeypatch.chdir(ROOT)  # commands run from the repository root; relative paths in YAMLs too
    argv = command.argv()
    if argv is None:
        pytest.skip(f"placeholders: {command}")
    args = parse(argv)
    if args is None:
        return
    for name in ("experiment", "suite", "simulation"):
        path = getattr(args, name, None)
        if path is None:
            continue
        if not Path(path).is_file():
            assert Path(path).stem.isupper(), f"{command}\nnames {path}, which is not in the repository"
            continue  # EXPERIMENT.yaml and the like
        overrides = list(getattr(args, "overrides", []))
        suite = name == "suite" or (name == "experiment" and is_suite_file(path))
        try:
            if name == "simulation":
                load_sim_config(path, overrides)
            elif suite:
                load_suite(path, overrides)
            else:
                load_config(path, overrides)
        except ConfigError as err:
            missing = made_elsewhere(err, path, overrides, suite) if name != "simulation" else None
            if missing:
                pytest.skip(f"needs {missing}, made by an earlier command: {command}")
            pytest.fail(f"{command}\nis refused: {err}")


# Links --------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
INLINE_CODE = re.compile(r"(`+).+?\1")


def prose(text: str) -> str:
    """The page without fenced code blocks and inline code (links there are not links)."""
    code = {number for _, lines in fenced_blocks(text) for number, _ in lines}
    lines = [line for number, line in enumerate(text.splitlines(), 1) if number not in code]
    return INLINE_CODE.sub("", "\n".join(line for line in lines if not FENCE.match(line)))


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, -1, -2 on repeats."""
    seen: dict[str, int] = {}
    for line in prose(page.read_text().replace("`", "")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path):
    text = prose(page.read_text())
    broken = []
    for target in LINK.findall(text) + REFERENCE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{rel(page)}: broken links"


def test_the_architecture_map_names_every_module():
    """docs/architecture.md's map cannot drift from the tree: every module of the package,
    `workloads/` and `dashboards/` is named in it."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    start = page.index("```")
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", page[start : page.index("```", start + 3)]))
    modules = [
        p
        for folder in ("platform/copus", "workloads", "dashboards")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "__init__.py"
    ]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if p.stem not in names)
    assert not missing, f"docs/architecture.md's map does not name: {missing}"
