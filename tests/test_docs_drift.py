"""What the README and the code's comments say about the code stays true of it: the command synopses match
the argparse parsers, and every repository file a module cites exists."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from netcl.cli.main import build_parser

REPO = Path(__file__).resolve().parent.parent
GLOBAL_OPTIONS = ("--debug", "--version")  # taken by every command; the README says so under the block


def _command_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Command line")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def readme_synopses() -> list[list[str]]:
    """The token lists of the README's command synopses (`netcl SUB ...`, continued on indented lines;
    brackets dropped, `# comments` cut)."""
    block = _command_section().split("```")[1]
    lines = []
    for line in block.splitlines():
        line = re.split(r"\s#", line, maxsplit=1)[0].rstrip()
        if line.startswith("netcl "):
            lines.append(line)
        elif line.startswith(" ") and line.strip() and lines:
            lines[-1] += " " + line.strip()
    return [line.replace("[", " ").replace("]", " ").split() for line in lines]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _is_literal(token: str) -> bool:
    """A word (or words joined by |) the user types as written, not a placeholder such as N or MODEL.onnx."""
    return all(re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", word) and not word.endswith(".onnx")
               for word in token.split("|"))


def _literal_choices(action: argparse.Action):
    """The words a positional takes as written: its choices, or the literal words of a metavar such as
    `lenet|conv|MODEL.onnx` (whose placeholders stand for any value); None when it takes any value."""
    if action.choices is not None:
        return {str(c) for c in action.choices}
    if isinstance(action.metavar, str) and "|" in action.metavar:
        return {w for w in action.metavar.split("|") if _is_literal(w)}
    return None


def _takes_placeholder(action: argparse.Action) -> bool:
    return action.choices is None and (not isinstance(action.metavar, str) or "|" not in action.metavar
                                       or not _is_literal(action.metavar))


class Synopsis:
    """What the README's lines of one subcommand name: its options, and the words of each positional."""

    def __init__(self, name: str, parser: argparse.ArgumentParser):
        self.name, self.parser = name, parser
        self.options = {o: a for a in parser._actions for o in a.option_strings}
        self.positionals = [a for a in parser._actions if not a.option_strings]
        self.seen_options: set[str] = set()
        self.words = {a.dest: set() for a in self.positionals}
        self.reached = set()
        self.problems: list[str] = []

    def read(self, tokens: list[str]) -> None:
        where = f"`netcl {self.name} {' '.join(tokens)}`"
        position, i = 0, 0
        while i < len(tokens):
            token = tokens[i]
            if token.startswith("-"):
                action = self.options.get(token)
                if action is None:
                    self.problems.append(f"{where}: the parser has no option {token}")
                    i += 1
                    continue
                self.seen_options.add(token)
                if action.nargs == 0:
                    i += 1
                    continue
                value = tokens[i + 1] if i + 1 < len(tokens) else None
                if value is None or value.startswith("-"):
                    self.problems.append(f"{where}: {token} takes a value the README does not show")
                elif value != "..." and action.choices is not None:
                    listed, allowed = set(value.split("|")), {str(c) for c in action.choices}
                    if listed != allowed:
                        self.problems.append(f"{where}: {token} lists {sorted(listed)}, the parser takes "
                                             f"{sorted(allowed)}")
                i += 2
                continue
            if position >= len(self.positionals):
                self.problems.append(f"{where}: the parser takes no positional argument for {token!r}")
            else:
                action = self.positionals[position]
                self.reached.add(action.dest)
                if _is_literal(token):
                    self.words[action.dest] |= set(token.split("|"))
                elif not _takes_placeholder(action):
                    self.problems.append(f"{where}: {token} stands for any value, but the parser takes only "
                                         f"{sorted(_literal_choices(action))}")
            position += 1
            i += 1

    def check(self) -> list[str]:
        problems = list(self.problems)
        for option, action in self.options.items():
            if option.startswith("--") and option not in GLOBAL_OPTIONS and action.help is not argparse.SUPPRESS \
                    and option not in self.seen_options and not isinstance(action, argparse._HelpAction):
                problems.append(f"netcl {self.name}: the README does not show {option}")
        for action in self.positionals:
            if action.dest not in self.reached:
                problems.append(f"netcl {self.name}: the README shows no value for {action.dest}")
            elif _literal_choices(action) is not None and self.words[action.dest] != _literal_choices(action):
                problems.append(f"netcl {self.name}: the README lists {sorted(self.words[action.dest])} for "
                                f"{action.dest}, the parser takes {sorted(_literal_choices(action))}")
        return problems


def synopsis_problems(synopses: list[list[str]], parser: argparse.ArgumentParser) -> list[str]:
    commands = _subcommands(parser)
    read = {name: Synopsis(name, sub) for name, sub in commands.items()}
    problems = []
    for tokens in synopses:
        if len(tokens) < 2 or tokens[1] not in read:
            problems.append(f"`{' '.join(tokens)}`: the parser has no such command")
            continue
        read[tokens[1]].read(tokens[2:])
    for name, synopsis in read.items():
        if not synopsis.reached and not synopsis.seen_options and not any(t[1:2] == [name] for t in synopses):
            problems.append(f"netcl {name}: the README has no synopsis")
        else:
            problems += synopsis.check()
    return problems


def test_readme_command_synopses_match_the_parsers():
    problems = synopsis_problems(readme_synopses(), build_parser())
    assert not problems, "\n".join(problems)


def test_readme_names_the_options_every_command_takes():
    section = _command_section()
    top = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert top == set(GLOBAL_OPTIONS)
    for option in GLOBAL_OPTIONS:
        assert f"`{option}`" in section or f"`netcl {option}`" in section, option


@pytest.mark.parametrize("line, problem", [
    ("netcl devices [--json] [--bench]", "does not show --rounds"),
    ("netcl devices [--json] [--bench] [--rounds N] [--fast]", "no option --fast"),
    ("netcl plan lenet|mec|conv [--batch B]", "lists ['conv', 'lenet', 'mec'] for network"),
    ("netcl plan lenet|mec|resnet20|conv|fft", "lists ['conv', 'fft', 'lenet', 'mec', 'resnet20']"),
    ("netcl tune MODEL.onnx", "MODEL.onnx stands for any value"),
    ("netcl plan lenet|mec|resnet20|conv [--mode heuristic|measure]", "--mode lists"),
    ("netcl tune gemm|conv|all [--quick] [--device] [--json]", "--device takes a value"),
    ("netcl tune gemm|conv|all extra [--quick] [--device SEL] [--json]", "no positional argument for 'extra'"),
    ("netcl teleport [--json]", "no such command"),
])
def test_the_synopsis_check_finds_drift(line, problem):
    parser = build_parser()
    good = [tokens for tokens in readme_synopses() if tokens[1] != line.split()[1]]
    tokens = line.replace("[", " ").replace("]", " ").split()
    assert any(problem in p for p in synopsis_problems(good + [tokens], parser)), problem


def test_a_missing_synopsis_is_found():
    synopses = [tokens for tokens in readme_synopses() if tokens[1] != "tune"]
    assert "netcl tune: the README has no synopsis" in synopsis_problems(synopses, build_parser())


CITED = re.compile(r"\b(?:docs|kernels|tests|benchmarks|ci|examples|netcl)/[\w./-]*\w\.(?:md|py|cl|sh|txt|toml)\b")


def test_files_the_code_cites_exist():
    missing = [f"{path.relative_to(REPO)}: {cited}"
               for folder in ("netcl", "kernels", "benchmarks", "examples")
               for path in sorted((REPO / folder).rglob("*")) if path.suffix in (".py", ".cl")
               for cited in CITED.findall(path.read_text()) if not (REPO / cited).exists()]
    assert not missing, "\n".join(missing)


def test_no_work_diary_in_the_code():
    """Docs, comments and docstrings say why, not who tried what when: no "session" in them."""
    diary = [f"{path.relative_to(REPO)}:{number}" for folder in ("docs", "netcl", "kernels", "benchmarks", "examples")
             for path in sorted((REPO / folder).rglob("*")) if path.suffix in (".py", ".cl", ".md", ".sh")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bsessions?\b", line, re.IGNORECASE)]
    assert not diary, "\n".join(diary)
