"""Read a verl launch script the way bash would run it, as far as a reader can without running it.

verl's example runs are shell scripts: some variables, then one long command,

    NODES=${NODES:-4}
    python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer' \\
        trainer.nnodes=$NODES actor_rollout_ref.rollout.name=vllm ... $@

:func:`read_script` walks the script statement by statement, keeping the variables it sets
(``NAME=value``, ``export NAME=value``, ``${NAME:-default}``, ``$((arithmetic))``, quotes, line
continuations), and returns the trainer command with every word expanded. A word fed by something
only the shell knows when it runs -- a positional ``$1``, a ``$(command)``, a variable the script
never sets, one set inside an ``if`` or a loop -- comes back with an :class:`Unknown` saying so.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

from snippets.rl.weight_sync.values import ConfigError, Unknown

TRAINER = re.compile(r"^(verl(\.\w+)*\.(main_ppo|fully_async_main)|recipe(\.\w+)*\.main_\w+)$")
TRAINER_FILE = re.compile(r"(^|/)(main_ppo\w*|main_\w+|\w+_main)\.py$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\+?=")
_OPEN = {
    "if": "an if block",
    "while": "a while loop",
    "until": "an until loop",
    "for": "a for loop",
    "case": "a case block",
    "select": "a select loop",
}
_CLOSE = {"fi", "done", "esac", "}"}


@dataclass
class Word:
    text: str  # as bash would pass it, unknown parts spelled as in the source
    unknown: Unknown | None = None


@dataclass
class Command:
    runs: str  # the module (``verl.trainer.main_ppo``) or the .py file
    args: list[Word]
    line: int  # where it starts in the script
    extra_args: bool = False  # ends with "$@": the script's own arguments are appended
    count: int = 1  # trainer commands the script has (this is the first)
    sourced: list[str] = field(default_factory=list)


def read_script(path: str, text: str) -> Command:
    """The first trainer command of the script, its words expanded (ConfigError if none)."""
    shell = _Shell(path)
    found: list[Command] = []
    for words, line in _statements(text):
        command = shell.run(words, line)
        if command is not None:
            found.append(command)
    if not found:
        raise ConfigError(
            f"{path} runs no verl trainer: no `python3 -m verl.trainer.main_ppo` "
            "(or another trainer main) in the script"
        )
    found[0].count, found[0].sourced = len(found), shell.sourced
    return found[0]


# ----------------------------------------------------------------------------- splitting


def _statements(text: str):
    """(raw words, line number) of each simple command: split on newlines, ; & | && || ( )."""
    words: list[str] = []
    word, i, line, start, n = "", 0, 1, 1, len(text)

    def end_word():
        nonlocal word
        if word:
            words.append(word)
        word = ""

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                line += 1
            else:
                word += text[i : i + 2]
            i += 2
            continue
        if c in "'\"`" or text.startswith("$(", i) or text.startswith("${", i):
            j = _closing(text, i)
            if not words and not word:
                start = line
            word += text[i:j]
            line += text.count("\n", i, j)
            i = j
            continue
        if c == "#" and not word:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in " \t":
            end_word()
        elif c in "\n;&|()":
            end_word()
            if words:
                yield words, start
            words = []
            line += c == "\n"
        else:
            if not words and not word:
                start = line
            word += c
        i += 1
    end_word()
    if words:
        yield words, start


def _closing(text: str, i: int) -> int:
    """Index just past the quoted or bracketed span starting at ``i``."""
    if text[i] in "'`":
        j = text.find(text[i], i + 1)
        return len(text) if j < 0 else j + 1
    if text[i] == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            if text[j] == "\\":
                j += 1
            elif text.startswith("$(", j) or text.startswith("${", j):
                j = _closing(text, j) - 1
            j += 1
        return j + 1
    close = ")" if text[i + 1] == "(" else "}"
    opening = text[i + 1]
    depth, j = 0, i + 1
    while j < len(text):
        ch = text[j]
        if ch in "'\"" and close == ")":
            j = _closing(text, j)
            continue
        depth += ch == opening
        depth -= ch == close
        j += 1
        if depth == 0:
            return j
    return j


# ----------------------------------------------------------------------------- running


class _Shell:
    def __init__(self, path: str):
        self.path = path
        self.env: dict[str, str | Unknown] = {}
        self.blocks: list[str] = []  # the enclosing if / for / { ... } as words
        self.sourced: list[str] = []

    def run(self, words: list[str], line: int) -> Command | None:
        while words:
            head = words[0]
            if head in _OPEN:
                self.blocks.append(_OPEN[head])
                return None
            if head in _CLOSE:
                if self.blocks:
                    self.blocks.pop()
                return None
            if head == "elif":
                return None
            if head in ("then", "do", "else", "!", "time"):
                words = words[1:]
            elif head == "{":
                self.blocks.append("a { } group or function")
                words = words[1:]
            elif len(words) >= 2 and words[-1] == "{":  # `name() {` once ( ) are split off
                self.blocks.append("a function")
                return None
            else:
                break
        assigns = []
        while words and _ASSIGN.match(words[0]):
            assigns.append(words.pop(0))
        if not words:
            for raw in assigns:
                self._assign(raw)
            return None
        name = self.expand(words[0]).text
        if name in ("export", "local", "declare", "typeset", "readonly"):
            for raw in words[1:]:
                if _ASSIGN.match(raw):
                    self._assign(raw)
            return None
        if name == "unset":
            for raw in words[1:]:
                self.env.pop(raw, None)
            return None
        if name in ("source", "."):
            self.sourced += [Path(self.expand(w).text).name for w in words[1:2]]
            return None
        if name == "read":
            for raw in words[1:]:
                if _NAME.fullmatch(raw):
                    self.env[raw] = Unknown(f"${raw}", f"{raw} is read from input when the script runs")
            return None
        return self._trainer(words, line)

    def _trainer(self, words: list[str], line: int) -> Command | None:
        expanded = [self.expand(w) for w in words]
        for k, w in enumerate(expanded):
            module = expanded[k + 1].text if w.text == "-m" and k + 1 < len(expanded) else None
            if module and TRAINER.match(module):
                rest = words[k + 2 :]
                break
            if TRAINER_FILE.search(w.text) and k and "python" in expanded[k - 1].text:
                module, rest = w.text, words[k + 1 :]
                break
        else:
            return None
        extra = [w for w in rest if _all_args(w)]
        args = [self.expand(w) for w in rest if not _all_args(w)]
        return Command(module, args, line, extra_args=bool(extra))

    def _assign(self, raw: str) -> None:
        name, value = raw.split("=", 1)
        append = name.endswith("+")
        name = name.rstrip("+")
        got = self._word(value)
        if append:
            old = self.env.get(name, "")
            got = (
                Unknown(f"{old}{got}", (old if isinstance(old, Unknown) else got).why)
                if isinstance(old, Unknown) or isinstance(got, Unknown)
                else old + got
            )
        if self.blocks:
            got = Unknown(
                f"${name}",
                f"{name} is set inside {self.blocks[-1]}, so its value depends on how the script runs",
            )
        self.env[name] = got

    # --------------------------------------------------------------------- expansion

    def expand(self, raw: str) -> Word:
        out = _Out()
        self._expand(raw, out, quoted=False)
        return Word(out.text, out.unknown)

    def _expand(self, raw: str, out: _Out, quoted: bool) -> None:
        i = 0
        while i < len(raw):
            c = raw[i]
            if c == "\\" and i + 1 < len(raw):
                nxt = raw[i + 1]
                out.add(nxt if not quoted or nxt in '"$`\\' else c + nxt)
                i += 2
            elif c == "'" and not quoted:
                j = raw.find("'", i + 1)
                j = len(raw) if j < 0 else j
                out.add(raw[i + 1 : j])
                i = j + 1
            elif c == '"' and not quoted:
                j = _closing(raw, i)
                self._expand(raw[i + 1 : j - 1], out, quoted=True)
                i = j
            elif c == "`" or raw.startswith("$(", i) and not raw.startswith("$((", i):
                j = _closing(raw, i)
                out.add(Unknown(raw[i:j], "it is a command's output, known only when the script runs"))
                i = j
            elif raw.startswith("$((", i):
                j = _closing(raw, i)
                out.add(self._arith(raw[i:j]))
                i = j
            elif raw.startswith("${", i):
                j = _closing(raw, i)
                out.add(self._braced(raw[i:j]))
                i = j
            elif c == "$" and i + 1 < len(raw) and (raw[i + 1].isalnum() or raw[i + 1] in "_@*#?!$"):
                m = _NAME.match(raw, i + 1)
                j = m.end() if m else i + 2
                out.add(self._variable(raw[i + 1 : j], raw[i:j]))
                i = j
            else:
                out.add(c)
                i += 1

    def _variable(self, name: str, source: str) -> str | Unknown:
        if name.isdigit() and name != "0":
            return Unknown(source, f"it is the script's argument ${name}")
        if name == "0":
            return self.path
        if name in "@*#?!$":
            return Unknown(source, f"{source} is known only when the script runs")
        if name not in self.env:
            where = f" or in {', '.join(self.sourced)}, which it sources" if self.sourced else ""
            return Unknown(
                source, f"{name} is not set in the script{where}: it would come from the environment"
            )
        return self.env[name]  # an Unknown keeps the text it expanded to and the root cause

    def _braced(self, source: str) -> str | Unknown:
        m = re.fullmatch(r"([A-Za-z_]\w*|\d+|[@*#?])(?:(:?[-=+?])(.*))?", source[2:-1], re.S)
        if not m:
            return Unknown(source, "it uses a shell string operation this reader does not evaluate")
        name, op, arg = m.groups()
        if op is None:
            return self._variable(name, source)
        if not _NAME.fullmatch(name):
            return Unknown(source, f"it is the script's argument ${name} (or {arg!r} without one)")
        value = self.env.get(name)
        if isinstance(value, Unknown):
            return value
        empty = value is None or (op.startswith(":") and value == "")
        if op.endswith("+"):
            return "" if empty else self._word(arg)
        if not empty:
            return value
        if op.endswith("?"):
            return Unknown(source, f"{name} must come from the environment (the script stops without it)")
        got = self._word(arg)
        if op.endswith("="):
            self.env[name] = got
        return got

    def _word(self, raw: str) -> str | Unknown:
        word = self.expand(raw)
        return Unknown(word.text, word.unknown.why) if word.unknown else word.text

    def _arith(self, source: str) -> int | Unknown:
        expr = source[3:-2]
        problem: list[Unknown] = []

        def value(match):
            name = match.group(1) or match.group(2) or match.group(3)
            got = self._variable(name, match.group(0)) if name in self.env or not name.isdigit() else None
            if name.isdigit() or isinstance(got, Unknown) or not str(got).strip().lstrip("-").isdigit():
                problem.append(got if isinstance(got, Unknown) else Unknown(match.group(0), "not a number"))
                return "0"
            return str(int(got))

        text = re.sub(r"\$\{(\w+)\}|\$(\w+)|\b([A-Za-z_]\w*)\b", value, expr)
        if problem:
            return Unknown(source, problem[0].why)
        try:
            return _evaluate(ast.parse(text.replace("/", "//").replace("////", "//"), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            return Unknown(source, "its arithmetic is beyond this reader")


def _all_args(raw: str) -> bool:
    return raw.strip('"') in ("$@", "${@}", "$*") or re.fullmatch(r'"?\$\{@:\d+\}"?', raw) is not None


class _Out:
    def __init__(self):
        self.text, self.unknown = "", None

    def add(self, piece) -> None:
        if isinstance(piece, Unknown) and self.unknown is None:
            self.unknown = piece
        self.text += str(piece)


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not shell arithmetic")


def looks_like_script(path: str, text: str) -> bool:
    """A .sh file, or a file starting with a shell's #! line."""
    return Path(path).suffix in (".sh", ".bash") or bool(re.match(r"#!.*\b(ba|z|da)?sh\b", text))
