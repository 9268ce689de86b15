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

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from snippets.rl.weight_sync.values import ConfigError, Unknown

TRAINER = re.compile(r"^(verl(\.\w+)*\.(main_\w+|fully_async_main)|recipe(\.\w+)*\.main_\w+)$")
TRAINER_FILE = re.compile(r"(^|/)(main_ppo\w*|main_\w+|\w+_main)\.py$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\+?=")
_OPEN = {
    "if": "an if block",
    "while": "a while loop",
    "until": "an until loop",
    "for": "a for loop",
    "select": "a select loop",
}
_CLOSE = {"fi", "done", "}"}


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
    end: int = 0  # the line it ends on
    broken: list[int] = field(default_factory=list)  # lines ending in `\ ` (+ a comment): bash ends there
    stray: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last line, first word)


class _KnownIf:
    """An ``if`` whose test the reader could decide: ``active`` for the branch being read."""

    def __init__(self, active: bool, taken: bool):
        self.active, self.taken = active, taken


class _Array(str):
    """``NAME=(a b c)`` as one word: the text ``NAME=(...)`` with the raw elements in ``items``."""

    items: list[str]

    def __new__(cls, head: str, items: list[str]):
        word = super().__new__(cls, head + "(" + " ".join(items) + ")")
        word.items = items
        return word


def read_script(path: str, text: str) -> Command:
    """The first trainer command of the script, its words expanded (ConfigError if none)."""
    shell = _Shell(path)
    found: list[Command] = []
    broken: list[int] = []
    stray: list[tuple[int, int, str]] = []
    try:
        if "\r\n" in text:
            raise ConfigError(
                f"line {text[: text.index(chr(13) + chr(10))].count(chr(10)) + 1}: the script has Windows "
                "(CRLF) line endings; bash keeps each \\r as part of the last word, so a `\\` before it "
                "does not continue the command and every value ends in \\r (convert it: dos2unix)"
            )
        prev = "\n"
        for words, line, end, term in _statements(text, broken):
            first = words[0]
            command = shell.chain(list(words), line, term, prev)
            prev = term
            if command is not None:
                command.end = end
                found.append(command)
            elif found and not isinstance(first, _Array) and _STRAY.match(first):
                stray.append((line, end, shell.expand(first).text.strip()))
        shell.check_closed()
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    if not found:
        where = f": it exits on line {shell.exited}" if shell.exited else ""
        raise ConfigError(
            f"{path} runs no verl trainer{where}: no `python3 -m verl.trainer.main_ppo` "
            "(or another trainer main) in the script"
        )
    first = found[0]
    first.count, first.sourced = len(found), shell.sourced
    first.broken = [b for b in broken if b == first.end]
    first.stray = [x for x in stray if x[0] > first.end] if first.broken else []
    return first


# A word like ``data.val_files=x``: a Hydra override, but not a shell assignment (the dot), so as
# the first word of a command bash looks it up as a program and fails.
_STRAY = re.compile(r"^[+~]{0,2}[A-Za-z_][\w-]*(\.[\w-]+)+=")


# ----------------------------------------------------------------------------- splitting


def _statements(text: str, broken: list[int] | None = None):
    """(raw words, first line, last line) of each simple command, split on newlines, ; & | && || ( ).

    ``NAME=(a b c)`` comes back as one :class:`_Array` word. A line ending in a backslash followed
    by blanks (and maybe a comment) is added to ``broken``: bash reads ``\\ `` as an escaped blank,
    so the command does not continue on the next line."""
    words: list[str] = []
    word, i, line, start, n = "", 0, 1, 1, len(text)
    heredocs: list[tuple[str, bool]] = []  # (delimiter, <<- strips tabs) whose bodies start next line
    wanted: list[bool] = []  # a `<<` whose delimiter is the next word

    def end_word():
        nonlocal word
        if word:
            words.append(word)
            if wanted:
                heredocs.append((_unquote(word), wanted.pop()))
            else:
                here = _HEREDOC.match(word)
                if here and here.group(2):
                    heredocs.append((_unquote(here.group(2)), bool(here.group(1))))
                elif here:
                    wanted.append(bool(here.group(1)))
        word = ""

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                line += 1
            else:
                if text[i + 1] in " \t" and broken is not None:
                    rest = text[i + 1 : text.find("\n", i + 1) if "\n" in text[i + 1 :] else n]
                    if not rest.strip() or rest.lstrip().startswith("#"):
                        broken.append(line)
                if not words and not word:
                    start = line
                word += text[i : i + 2]
            i += 2
            continue
        if (
            c == "("
            and _ASSIGN_OPEN.fullmatch(word)
            and all(_ASSIGN.match(w) or w in _DECLARE for w in words)
        ):
            items, i, line = _array(text, i + 1, line)
            words.append(_Array(word, items))
            word = ""
            continue
        if _opens_span(text, i):
            j = _span(text, i, line)
            if not words and not word:
                start = line
            word += text[i:j]
            line += text.count("\n", i, j)
            i = j
            continue
        if c == "#" and not word:
            i = _line_end(text, i)
            continue
        if c in " \t":
            end_word()
        elif c == "&" and (text[i - 1 : i] in "<>" and i > 0 or text.startswith("&>", i)):
            if not words and not word:
                start = line
            word += c  # part of a redirection: 2>&1, &>log
        elif c == "(" and text.startswith("((", i) and not word and all(w in _LEADING for w in words):
            j, depth = i, 0  # an arithmetic command (( ... )): one word, so `<<` in it is a shift
            while j < n:
                depth += (text[j] == "(") - (text[j] == ")")
                j += 1
                if depth == 0:
                    break
            start, word = line, text[i:j]
            line += text.count("\n", i, j)
            i = j
            continue
        elif c in "\n;&|()":
            end_word()
            term = c
            if text.startswith(";;", i) or text.startswith("&&", i) or text.startswith("||", i):
                term, i = text[i : i + 2], i + 1
            if words:
                yield words, start, line, term
            if term == ";;":
                yield [";;"], line, line, term
            words = []
            line += c == "\n"
            if c == "\n" and heredocs:  # a here-document's body is data for the command, not script
                i, line = _skip_heredocs(text, i + 1, line, heredocs)
                heredocs.clear()
                continue
        else:
            if not words and not word:
                start = line
            word += c
        i += 1
    end_word()
    if words:
        yield words, start, line, "\n"


_LEADING = ("then", "do", "else", "!", "time", "{")  # words that may come before a command
_HEREDOC = re.compile(r"^\d*<<(?!<)(-?)(.*)$", re.S)


def _unquote(word: str) -> str:
    """A here-document's delimiter as bash compares it: quotes and backslashes removed."""
    return re.sub(r"""['"\\]""", "", word)


def _skip_heredocs(text: str, i: int, line: int, heredocs: list[tuple[str, bool]]) -> tuple[int, int]:
    """Index and line just past the bodies of ``heredocs``, which start at ``i`` (on ``line``). A
    body with no delimiter line runs to the end of the script, as bash reads it (with a warning)."""
    for delimiter, tabs in heredocs:
        while i < len(text):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            body_line = text[i:end]
            i, line = end + 1, line + 1
            if (body_line.lstrip("\t") if tabs else body_line) == delimiter:
                break
    return i, line


_REDIRECT = re.compile(r"^(\d*|&)(>>|>&|<&|>\||<<<|<<|>|<)(.*)$")
_DECLARE = ("export", "local", "declare", "typeset", "readonly", "-a", "-g", "-x", "-r")
_ASSIGN_OPEN = re.compile(r"[A-Za-z_]\w*\+?=")


def _array(text: str, i: int, line: int) -> tuple[list[str], int, int]:
    """The raw elements of an array body starting at ``i`` (just past ``(``), the index past its
    ``)`` and the line there. Newlines and comments inside the parentheses separate elements."""
    items: list[str] = []
    word, n, opened = "", len(text), line
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                line += 1
            else:
                word += text[i : i + 2]
            i += 2
            continue
        if _opens_span(text, i):
            j = _span(text, i, line)
            word += text[i:j]
            line += text.count("\n", i, j)
            i = j
            continue
        if c == "#" and not word:
            i = _line_end(text, i)
            continue
        if c in " \t\n":
            if word:
                items.append(word)
            word = ""
            line += c == "\n"
        elif c == ")":
            if word:
                items.append(word)
            return items, i + 1, line
        else:
            word += c
        i += 1
    raise ConfigError(f"line {opened}: an array's `(` is never closed, so bash stops with a syntax error")


class _Unclosed(Exception):
    """A quote, ``$(``, ``${`` or ``$((`` with no end: bash stops with a syntax error."""


_KINDS = {"'": "a ' quote", '"': 'a " quote', "`": "a ` command substitution"}


def _opens_span(text: str, i: int) -> bool:
    """A quote, a backquote, ``$(`` or ``${`` starts at ``i``: a span read whole (:func:`_span`)."""
    return text[i] in "'\"`" or text.startswith("$(", i) or text.startswith("${", i)


def _line_end(text: str, i: int) -> int:
    """Index of the newline ending the line at ``i`` (a comment runs to it), or the text's end."""
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _span(text: str, i: int, line: int) -> int:
    """:func:`_closing`, as a one-line ConfigError naming the line when the span never closes."""
    try:
        return _closing(text, i)
    except _Unclosed:
        kind = _KINDS.get(text[i]) or ("a $(( )) or $( )" if text[i + 1] == "(" else "a ${ }")
        raise ConfigError(
            f"line {line}: {kind} opened here is never closed, so bash stops with a syntax error "
            "before running anything"
        ) from None


def _closing(text: str, i: int) -> int:
    """Index just past the quoted or bracketed span starting at ``i`` (_Unclosed if it has no end)."""
    if text[i] in "'`":
        j = text.find(text[i], i + 1)
        if j < 0:
            raise _Unclosed()
        return j + 1
    if text[i] == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            if text[j] == "\\":
                j += 1
            elif text.startswith("$(", j) or text.startswith("${", j):
                j = _closing(text, j) - 1
            j += 1
        if j >= len(text):
            raise _Unclosed()
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
    raise _Unclosed()


# ----------------------------------------------------------------------------- running


class _Shell:
    def __init__(self, path: str):
        self.path = path
        self.env: dict[str, str | Unknown | list[Word]] = {}
        self.blocks: list[str] = []  # the enclosing if / for / { ... } as words
        self.sourced: list[str] = []
        self.cases: list[dict] = []  # the enclosing case ... esac, innermost last
        self.exited = 0  # the line of an `exit` outside any block, if one comes first
        self.status: bool | None = None  # did the last command of an && / || list succeed?
        self.line = 0  # the line of the statement being read
        self.opened: dict[int, int] = {}  # depth in self.blocks -> the line that block opened on

    def chain(self, words: list[str], line: int, term: str, prev: str) -> Command | None:
        """Run one statement of an ``A && B || C`` list: B runs when A succeeded, C when it failed.
        A ``[ ... ]`` test whose words are known decides; otherwise what B or C sets is marked
        as depending on how the script runs."""
        self.line = line
        depth = len(self.blocks)
        try:
            return self._chain(words, line, term, prev)
        finally:
            for d in range(depth, len(self.blocks)):
                self.opened[d] = line

    def _chain(self, words: list[str], line: int, term: str, prev: str) -> Command | None:
        head = next((w for w in words if w not in ("!", "time")), "")
        if prev in ("&&", "||") and head in (*_CLOSE, "esac", "then", "do", "else", "elif"):
            raise ConfigError(
                f"line {line}: `{head}` right after {prev}, so bash stops with a syntax error there; "
                "this reader refuses the script"
            )
        if prev not in ("&&", "||"):
            self.status = None
        elif self.status is not None and (prev == "&&") != self.status:
            return None  # bash skips it; the status stays what it was
        elif self.status is None:
            depth, marker = len(self.blocks), f"a command after {prev}"
            self.blocks.append(marker)
            try:
                self.run(words, line, term)
            finally:  # drop the marker; a block the command opened (`&& if ...`) stays open
                if len(self.blocks) > depth and self.blocks[depth] is marker:
                    del self.blocks[depth]
            self.status = None
            return None
        self.status = None
        if words and words[0] in ("[", "[[", "test"):
            self.status = self._test(words)
            return None
        succeeds = bool(words) and (
            all(_ASSIGN.match(w) for w in words) or words[0] in ("export", "true", ":")
        )
        command = self.run(list(words), line, term)
        if succeeds:
            self.status = True
        return command

    def check_closed(self) -> None:
        """ConfigError for an if / loop / case / { } the script never closes: bash reads to the end
        of the file looking for its end and stops with a syntax error (what came before it runs)."""
        open_ = [(self.opened.get(d, 0), _block_name(b)) for d, b in enumerate(self.blocks)]
        open_ += [(f["line"], "a case") for f in self.cases]
        if not open_:
            return
        line, name = min(open_)
        if self.exited and self.exited < line:
            return  # bash exits before it reads that far
        closer = {"an if block": "fi", "a case": "esac"}.get(name) or (
            "}" if "{" in name or "function" in name else "done"
        )
        raise ConfigError(
            f"line {line}: {name} opened here has no `{closer}`, so bash stops with 'syntax error: "
            "unexpected end of file' when it reaches it; this reader refuses the script"
        )

    def _if(self, words: list[str], term: str) -> bool:
        """``if [ test ]; then`` with a test whose words are known: only the branch bash takes
        runs. True when ``words`` were handled here (an unknown test falls back to marking what
        the branches set as unknown)."""
        top = self.blocks[-1] if self.blocks else None
        outer_skip = any(isinstance(b, _KnownIf) and not b.active for b in self.blocks) or any(
            f["state"] == "body" and not f["active"] for f in self.cases
        )
        head = words[0]
        if head == "if":
            if outer_skip:
                self.blocks.append(_KnownIf(False, True))
                return True
            known = self._test(words[1:]) if words[1:2] and words[1] in ("[", "[[", "test") else None
            if known is None or term in ("&&", "||"):
                return False
            self.blocks.append(_KnownIf(known, known))
            return True
        if not isinstance(top, _KnownIf):
            return False
        if head == "fi":
            self.blocks.pop()
            return True
        if head == "else":
            top.active, top.taken = not top.taken, True
            return len(words) == 1  # `else X=1` on one line: run the rest
        # elif: the next test decides, unless a branch was taken already
        known = self._test(words[1:]) if words[1:2] and words[1] in ("[", "[[", "test") else None
        if top.taken:
            top.active = False
        elif known is None or term in ("&&", "||"):
            self.blocks[-1] = "an if block"
        else:
            top.active = top.taken = known
        return True

    def _test(self, words: list[str]) -> bool | None:
        """``[ a = b ]``, ``[ "$n" -gt 1 ]``, ``[ -n x ]``: True / False, or None when not known."""
        args = [self.expand(w) for w in words[1:]]
        if args and args[-1].text in ("]", "]]"):
            args = args[:-1]
        if any(a.unknown for a in args):
            return None
        t = [a.text for a in args]
        negate = bool(t) and t[0] == "!"
        t = t[1:] if negate else t
        got = None
        if len(t) == 2 and t[0] in ("-n", "-z"):
            got = (t[1] != "") == (t[0] == "-n")
        elif len(t) == 3 and t[1] in ("=", "==", "!="):
            got = (t[0] == t[2]) == (t[1] != "!=")
        elif len(t) == 3 and t[1] in ("-eq", "-ne", "-gt", "-ge", "-lt", "-le"):
            try:
                a, b = int(t[0]), int(t[2])
            except ValueError:
                return None
            got = {"-eq": a == b, "-ne": a != b, "-gt": a > b, "-ge": a >= b, "-lt": a < b, "-le": a <= b}[
                t[1]
            ]
        return None if got is None else got != negate

    def run(self, words: list[str], line: int, term: str = "\n") -> Command | None:
        if self._case(words, term):
            return None
        if words[0] in ("if", "elif", "else", "fi") and self._if(words, term):
            return None
        skipping = any(f["state"] == "body" and not f["active"] for f in self.cases) or any(
            isinstance(b, _KnownIf) and not b.active for b in self.blocks
        )
        if skipping:  # a branch bash does not take: keep the nesting, run nothing
            if words[0] in _OPEN:
                self.blocks.append(_OPEN[words[0]])
            elif words[0] in _CLOSE and self.blocks:
                self.blocks.pop()
            return None
        while words:
            head = words[0]
            if head in _OPEN:
                self.blocks.append(_OPEN[head])
                return None
            if head in _CLOSE:
                if not self.blocks:
                    raise ConfigError(
                        f"line {line}: `{head}` closes no open block, so bash stops with a syntax error "
                        "there; this reader refuses the script"
                    )
                self.blocks.pop()
                return None
            if head == "elif":
                return None
            if head in ("then", "do", "else", "!", "time"):
                words = words[1:]
                if not words:
                    return None
            elif head == "{":
                self.blocks.append("a { } group or function")
                words = words[1:]
            elif len(words) >= 2 and words[-1] == "{":  # `name() {` once ( ) are split off
                self.blocks.append("a function")
                return None
            else:
                break
        if not words:
            return None
        if words[0].startswith("((") and words[0].endswith("))"):
            self._assigned(words[0][2:-2], "the arithmetic command (( ))")
            return None
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
        if name == "exit" and not self._uncertain() and not self.cases and not self.exited:
            self.exited = line
            return None
        if name == "read":
            for raw in words[1:]:
                if _NAME.fullmatch(raw):
                    self.env[raw] = Unknown(f"${raw}", f"{raw} is read from input when the script runs")
            return None
        return self._trainer(words, line)

    def _case(self, words: list[str], term: str) -> bool:
        """``case WORD in pattern) ... ;; esac``: with WORD known, only the branch bash takes runs;
        with WORD unknown every branch runs and what it sets is marked unknown. True when
        ``words`` were case syntax."""
        frame = self.cases[-1] if self.cases else None
        if words == [";;"]:
            if frame:
                frame["state"], frame["active"] = "pattern", False
            return True
        if words[0] == "case" and len(words) >= 3 and words[2] == "in":
            subject = self.expand(words[1])
            live = not any(f["state"] == "body" and not f["active"] for f in self.cases)
            frame = {"subject": subject, "state": "pattern", "active": False, "done": False, "live": live}
            frame["line"] = self.line
            if subject.unknown and live:
                self.blocks.append(f"a case on {words[1]} ({subject.unknown.why})")
            self.cases.append(frame)
            words = words[3:]
            if not words:
                return True
        elif words[0] == "esac" and frame:
            self.cases.pop()
            if frame["subject"].unknown and frame["live"] and self.blocks:
                self.blocks.pop()
            return True
        if not frame or frame["state"] != "pattern":
            return False
        frame.setdefault("patterns", []).extend(self.expand(w).text for w in words if w != "(")
        if term == ")":
            subject = frame["subject"]
            if subject.unknown:
                frame["active"] = frame["live"]
            else:
                hit = any(fnmatch.fnmatchcase(subject.text, pattern) for pattern in frame["patterns"])
                frame["active"] = frame["live"] and hit and not frame["done"]
                frame["done"] = frame["done"] or hit
            frame["label"] = " | ".join(frame["patterns"]) + ")"
            frame["state"], frame["patterns"] = "body", []
        return True

    def _trainer(self, words: list[str], line: int) -> Command | None:
        expanded: list[Word] = []
        extra = False
        target = False
        for w in words:
            if target:  # the file of a redirection: bash opens it, the command never sees it
                target = False
                continue
            redirect = _REDIRECT.match(w)
            if redirect:
                target = not redirect.group(3)
                continue
            if _all_args(w):
                extra = True
                continue
            expanded += self.expand_words(w)
        for k, w in enumerate(expanded):
            module = expanded[k + 1].text if w.text == "-m" and k + 1 < len(expanded) else None
            if module and TRAINER.match(module):
                rest = expanded[k + 2 :]
                break
            if TRAINER_FILE.search(w.text) and k and "python" in expanded[k - 1].text:
                module, rest = w.text, expanded[k + 1 :]
                break
        else:
            return None
        return Command(module, rest, line, extra_args=extra)

    def _assign(self, raw: str) -> None:
        if isinstance(raw, _Array):
            self._assign_array(raw)
            return
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
        blocks = self._uncertain()
        if blocks:
            why = f"{name} is set inside {blocks[-1]}, so its value depends on how the script runs"
            branch = self._branch()
            if branch:  # say what each branch of a case on an unknown word sets
                why = f"{name} is set inside {blocks[-1]}:"
                old = self.env.get(name)
                seen = old.why if isinstance(old, Unknown) and old.why.startswith(why) else why
                sep = "" if seen.endswith(":") else ";"
                why = f"{seen}{sep} {branch} {got}"
            got = Unknown(f"${name}", why)
        self.env[name] = got

    def _uncertain(self) -> list[str]:
        """The enclosing blocks whose branch is not known (an if the reader could decide is not)."""
        return [b for b in self.blocks if not isinstance(b, _KnownIf)]

    def _branch(self) -> str | None:
        """``gpu)`` when the innermost block is a branch of a case on an unknown word."""
        frame = self.cases[-1] if self.cases else None
        blocks = self._uncertain()
        if frame and frame["subject"].unknown and blocks and blocks[-1].startswith("a case on"):
            return frame.get("label")
        return None

    def _assign_array(self, raw: _Array) -> None:
        name = raw[: raw.index("=")]
        append = name.endswith("+")
        name = name.rstrip("+")
        items = [w for item in raw.items for w in self.expand_words(item)]
        blocks = self._uncertain()
        if blocks:  # the words as that branch would set them, each marked as uncertain
            why = f"{name} is set inside {blocks[-1]}, so its value depends on how the script runs"
            items = [Word(w.text, w.unknown or Unknown(w.text, why)) for w in items]
        old = self.env.get(name)
        if append and old is not None:
            old = (
                old if isinstance(old, list) else [Word(str(old), old if isinstance(old, Unknown) else None)]
            )
            items = old + items
        self.env[name] = items

    # --------------------------------------------------------------------- expansion

    def expand(self, raw: str) -> Word:
        """``raw`` as one word, as bash expands the right side of an assignment (no splitting)."""
        out = _Out(split=False)
        self._expand(raw, out, quoted=False)
        words = out.words()
        text = " ".join(w.text for w in words)
        return Word(text, next((w.unknown for w in words if w.unknown), None))

    def expand_words(self, raw: str) -> list[Word]:
        """``raw`` as the words bash passes to a command: arrays and unquoted values split."""
        out = _Out(split=True)
        self._expand(raw, out, quoted=False)
        return out.words()

    def _expand(self, raw: str, out: _Out, quoted: bool) -> None:
        i = 0
        while i < len(raw):
            c = raw[i]
            if c == "\\" and i + 1 < len(raw):
                nxt = raw[i + 1]
                if nxt != "\n":  # backslash-newline is removed, in double quotes too
                    out.add(nxt if not quoted or nxt in '"$`\\' else c + nxt)
                i += 2
            elif c == "'" and not quoted:
                j = raw.find("'", i + 1)
                j = len(raw) if j < 0 else j
                out.add(raw[i + 1 : j])
                i = j + 1
            elif c == '"' and not quoted:
                j = _span(raw, i, self.line)
                out.add("")  # "" is a word even when empty
                self._expand(raw[i + 1 : j - 1], out, quoted=True)
                i = j
            elif c == "`" or raw.startswith("$(", i) and not raw.startswith("$((", i):
                j = _span(raw, i, self.line)
                out.add(Unknown(raw[i:j], "it is a command's output, known only when the script runs"))
                i = j
            elif raw.startswith("$((", i):
                j = _span(raw, i, self.line)
                out.add(self._arith(raw[i:j]))
                i = j
            elif raw.startswith("${", i):
                j = _span(raw, i, self.line)
                out.expansion(self._braced(raw[i:j]), quoted)
                i = j
            elif c == "$" and i + 1 < len(raw) and (raw[i + 1].isalnum() or raw[i + 1] in "_@*#?!$"):
                m = _NAME.match(raw, i + 1)
                j = m.end() if m else i + 2
                out.expansion(self._scalar(self._variable(raw[i + 1 : j], raw[i:j])), quoted)
                i = j
            else:
                out.add(c)
                i += 1

    @staticmethod
    def _scalar(value):
        """``$NAME`` of an array is its first element."""
        if isinstance(value, list):
            return (value[0].unknown or value[0].text) if value else ""
        return value

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

    def _braced(self, source: str):
        body = source[2:-1]
        arr = re.fullmatch(r"(#?)([A-Za-z_]\w*)\[(@|\*|\d+)\]", body)
        if arr:
            count, name, index = arr.groups()
            value = self.env.get(name)
            if name not in self.env or isinstance(value, Unknown):
                return self._variable(name, source)
            items = value if isinstance(value, list) else [Word(value)]
            if count:
                return str(len(items)) if index in "@*" else str(len(items[int(index)].text))
            if index == "@":
                return items
            if index == "*":
                return Word(
                    " ".join(w.text for w in items), next((w.unknown for w in items if w.unknown), None)
                )
            k = int(index)
            return (items[k].unknown or items[k].text) if k < len(items) else ""
        if body.startswith("#") and _NAME.fullmatch(body[1:]):
            value = self._scalar(self._variable(body[1:], source))
            return value if isinstance(value, Unknown) else str(len(value))
        m = re.fullmatch(r"([A-Za-z_]\w*|\d+|[@*#?])(?:(:?[-=+?])(.*))?", source[2:-1], re.S)
        if not m:
            return Unknown(source, "it uses a shell string operation this reader does not evaluate")
        name, op, arg = m.groups()
        if op is None:
            return self._scalar(self._variable(name, source))
        if not _NAME.fullmatch(name):
            return Unknown(source, f"it is the script's argument ${name} (or {arg!r} without one)")
        value = self._scalar(self.env.get(name))
        if (
            isinstance(value, Unknown)
            and self._branch()
            and value.why.startswith(f"{name} is set inside a case on")
        ):
            value = None  # set only by another branch of this case, which bash did not take
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

    def _arith(self, source: str, depth: int = 0) -> int | Unknown:
        """``$((expr))`` as bash computes it (see :class:`_Arith`), or an Unknown saying why not.
        An error bash reports (division by 0, a negative exponent) is a ConfigError naming the line,
        unless the line sits in a branch the reader cannot decide (then an Unknown)."""
        try:
            return self._calc(source[3:-2], 0)
        except _Unknowable as got:
            return Unknown(source, got.args[0].why)
        except _Beyond as got:
            self._assigned(source[3:-2], source)
            return Unknown(source, f"it uses {got} inside $(( )), which this reader does not evaluate")
        except _ArithError as got:
            if self._uncertain():
                return Unknown(source, f"bash reports '{got}' here if this branch runs")
            raise ConfigError(
                f"line {self.line}: {source}: bash reports '{got}' and skips the rest of that line; "
                "this reader does not guess what the script means"
            ) from None

    def _assigned(self, expr: str, where: str) -> None:
        """Variables an arithmetic expression sets (``N=3``, ``N+=1``, ``N++``): unknown from here
        on, as this reader does not evaluate assignments."""
        names = re.findall(r"([A-Za-z_]\w*)\s*(?:\*\*|<<|>>|[-+*/%&|^])?=(?!=)", expr)
        names += re.findall(r"(?:\+\+|--)\s*([A-Za-z_]\w*)|([A-Za-z_]\w*)\s*(?:\+\+|--)", expr)
        for name in names:
            for one in [name] if isinstance(name, str) else name:
                if one:
                    why = f"{one} is changed on line {self.line} by {where}, which this reader does not evaluate"
                    self.env[one] = Unknown(f"${one}", why)

    def _calc(self, expr: str, depth: int) -> int:
        if depth > 32:
            raise _Beyond("variables whose values refer to each other more than 32 deep")
        calc = _Arith(expr, lambda text: self._arith_ref(text, depth))
        return calc.value(calc.parse())

    def _arith_ref(self, text: str, depth: int) -> int:
        """A name or ``$...`` inside $(( )): its value, itself read as an expression (as bash does;
        an empty value is 0)."""
        if text.startswith("${"):
            value = self._braced(text)
        elif text[1:].isdigit():
            value = Unknown(text, f"it is the script's argument {text}")
        else:
            value = self._variable(text.lstrip("$"), "$" + text.lstrip("$"))
        if isinstance(value, Word):
            value = value.unknown or value.text
        value = self._scalar(value)
        if isinstance(value, Unknown):
            raise _Unknowable(value)
        return self._calc(str(value), depth + 1) if str(value).strip() else 0


def _block_name(block) -> str:
    """How a report names an entry of ``_Shell.blocks``."""
    if isinstance(block, _KnownIf):
        return "an if block"
    return "a case" if block.startswith("a case on") else block


def _all_args(raw: str) -> bool:
    return raw.strip('"') in ("$@", "${@}", "$*") or re.fullmatch(r'"?\$\{@:\d+\}"?', raw) is not None


class _Out:
    """The words an expansion makes. Literal text and quoted values join the current word; an
    unquoted value is split at blanks (when ``split``); ``"${A[@]}"`` makes one word per element."""

    def __init__(self, split: bool):
        self.split = split
        self.fields: list[list] = []  # [text, unknown]
        self.open = False  # the last field still takes text

    def _field(self) -> list:
        if not self.open:
            self.fields.append(["", None])
            self.open = True
        return self.fields[-1]

    def add(self, piece) -> None:
        field = self._field()
        if isinstance(piece, Word):
            piece = piece.unknown or piece.text
        if isinstance(piece, Unknown) and field[1] is None:
            field[1] = piece
        field[0] += str(piece)

    def expansion(self, value, quoted: bool) -> None:
        if isinstance(value, Word):
            value = value.unknown or value.text
        if isinstance(value, list):
            self._elements(value, quoted)
        elif isinstance(value, Unknown) and not quoted and self.split and value.text[:1] not in "$`":
            # split as bash would; the words that still spell a $reference carry the unknown
            words = [
                Word(p, value if ("$" in p or "`" in p or p == value.text) else None)
                for p in value.text.split()
            ]
            self._elements(words, False, text=value.text)
        elif isinstance(value, Unknown) or quoted or not self.split:
            if isinstance(value, Word) or value != "" or quoted:
                self.add(value)
        else:
            self._elements([Word(p) for p in str(value).split()], False, text=str(value))

    def _elements(self, items: list[Word], quoted: bool, text: str | None = None) -> None:
        if not self.split:
            self.add(" ".join(w.text for w in items))
            if any(w.unknown for w in items):
                field = self.fields[-1]
                field[1] = field[1] or next(w.unknown for w in items if w.unknown)
            return
        if text is not None and text[:1].isspace():
            self.open = False
        for k, w in enumerate(items):
            if k:
                self.open = False
            field = self._field()
            field[0] += w.text
            field[1] = field[1] or w.unknown
        if text is not None and text[-1:].isspace():
            self.open = False

    def words(self) -> list[Word]:
        return [Word(text, unknown) for text, unknown in self.fields]


# ----------------------------------------------------------------------------- $(( ))
#
# bash's arithmetic: signed 64-bit integers that wrap, `/` and `%` truncating toward zero, `**`
# by repeated squaring (so no exponent can hang), constants in base 10, 0x16, 010 (octal) and
# BASE#DIGITS, C's operators and precedence with `**` binding tighter than `*` and looser than
# the unary signs (`-2**2` is 4). What bash itself refuses (division by 0, a negative exponent,
# `08`) raises _ArithError with bash's words; what this reader does not evaluate (assignments,
# ++ / --, `$( )` inside) raises _Beyond.


class _ArithError(Exception):
    """bash reports this error and skips the rest of the line (the message is bash's)."""


class _Unknowable(Exception):
    """A value inside $(( )) that only the running script knows (args[0] is the Unknown)."""


class _Beyond(Exception):
    """A construct inside $(( )) this reader does not evaluate (the message names it)."""


_BITS = 64
_INT_MIN = -(1 << (_BITS - 1))


def _wrap(value: int) -> int:
    """``value`` as bash's intmax_t holds it (two's complement, 64 bits)."""
    value &= (1 << _BITS) - 1
    return value - (1 << _BITS) if value >> (_BITS - 1) else value


_ARITH_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d[\w@#]*)|(?P<ref>\$\{[^}]*\}|\$[A-Za-z_]\w*|\$\d|[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%()<>&|^!~?:,=]))"
)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
# binary operators by precedence, loosest first (bash's expr.c); `**` and ?: are handled apart
_BINARY = [
    ("||",),
    ("&&",),
    ("|",),
    ("^",),
    ("&",),
    ("==", "!="),
    ("<", ">", "<=", ">="),
    ("<<", ">>"),
    ("+", "-"),
    ("*", "/", "%"),
]


def _constant(text: str) -> int:
    """A number as bash reads it inside $(( )): 42, 0x2A, 052, 16#2a, 64#@_."""
    base, digits = 10, text
    if "#" in text:
        head, digits = text.split("#", 1)
        if not head.isdigit() or not digits:
            raise _ArithError(f"{text}: invalid number")
        base = int(head)
        if not 2 <= base <= 64:
            raise _ArithError(f"{text}: invalid arithmetic base")
    elif text[:2] in ("0x", "0X"):
        base, digits = 16, text[2:]
    elif text.startswith("0") and len(text) > 1:
        base, digits = 8, text[1:]
    value = 0
    for ch in digits:
        k = _DIGITS.index(ch) if ch in _DIGITS else 99
        if base <= 36 and ch.isalpha():
            k = _DIGITS.index(ch.lower())
        if k >= base:
            raise _ArithError(f"{text}: value too great for base")
        value = _wrap(value * base + k)
    return value


def _power(base: int, exp: int) -> int:
    if exp < 0:
        raise _ArithError("exponent less than 0")
    out = 1
    while exp:
        if exp & 1:
            out = _wrap(out * base)
        base, exp = _wrap(base * base), exp >> 1
    return out


def _binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise _ArithError("division by 0")
        if a == _INT_MIN and b == -1:
            return _INT_MIN if op == "/" else 0  # bash's special case: no overflow trap
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C truncates toward zero
        return q if op == "/" else a - q * b
    if op in ("<<", ">>"):
        b &= _BITS - 1  # bash leaves the count to the CPU: x86-64 and arm64 take it mod 64
        return _wrap(a << b) if op == "<<" else a >> b
    return _wrap(
        {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "&": lambda: a & b,
            "|": lambda: a | b,
            "^": lambda: a ^ b,
            "==": lambda: int(a == b),
            "!=": lambda: int(a != b),
            "<": lambda: int(a < b),
            ">": lambda: int(a > b),
            "<=": lambda: int(a <= b),
            ">=": lambda: int(a >= b),
        }[op]()
    )


class _Arith:
    """One $(( )) expression: parsed to a tree, then evaluated the way bash does (&&, || and ?:
    evaluate only the side they need). ``ref`` turns a name or ``$...`` into an int or Unknown."""

    def __init__(self, expr: str, ref):
        if re.search(r"\+\+|--", re.sub(r"\s+", "", expr)) and re.search(
            r"(\+\+|--)\s*[$A-Za-z_]|[A-Za-z_}]\w*\s*(\+\+|--)", expr
        ):
            raise _Beyond("++ or -- on a variable")
        self.tokens, self.k, self.ref, self.depth = self._tokens(expr), 0, ref, 0

    @staticmethod
    def _tokens(expr: str) -> list[tuple[str, str]]:
        tokens, i = [], 0
        while expr[i:].strip():
            m = _ARITH_TOKEN.match(expr, i)
            if not m:
                raise _Beyond(f"{expr[i:].strip()[:1]!r}")
            kind = m.lastgroup
            tokens.append((kind, m.group(kind)))
            i = m.end()
        return tokens

    def parse(self):
        if not self.tokens:
            return ("num", 0)  # $(( )) is 0
        tree = self._comma()
        if self.k < len(self.tokens):
            raise _ArithError(f"syntax error in expression (error token is {self.tokens[self.k][1]!r})")
        return tree

    def _peek(self) -> str | None:
        return (
            self.tokens[self.k][1] if self.k < len(self.tokens) and self.tokens[self.k][0] == "op" else None
        )

    def _take(self, op: str) -> bool:
        if self._peek() == op:
            self.k += 1
            return True
        return False

    def _comma(self):
        tree = self._ternary()
        while self._take(","):
            tree = (",", tree, self._ternary())
        return tree

    def _ternary(self):
        test = self._level(0)
        if self._peek() == "=":
            raise _Beyond("an assignment")
        if not self._take("?"):
            return test
        yes = self._comma()
        if not self._take(":"):
            raise _ArithError("`:' expected for conditional expression")
        return ("?", test, yes, self._ternary())

    def _level(self, n: int):
        if n == len(_BINARY):
            return self._power()
        tree = self._level(n + 1)
        while self._peek() in _BINARY[n]:
            op = self.tokens[self.k][1]
            self.k += 1
            tree = (op, tree, self._level(n + 1))
        return tree

    def _power(self):
        base = self._unary()
        if self._take("**"):
            return ("**", base, self._power())  # right to left: 2**3**2 is 2**9
        return base

    def _unary(self):
        signs = []
        while self._peek() in ("-", "+", "!", "~"):
            signs.append("u" + self.tokens[self.k][1])
            self.k += 1
        if self._take("("):
            self.depth += 1
            if self.depth > 64:
                raise _Beyond("parentheses nested more than 64 deep")
            tree = self._comma()
            if not self._take(")"):
                raise _ArithError("missing `)'")
            self.depth -= 1
        else:
            tree = self._operand()
        for sign in reversed(signs):
            tree = (sign, tree)
        return tree

    def _operand(self):
        if self.k >= len(self.tokens) or self.tokens[self.k][0] == "op":
            raise _ArithError("syntax error: operand expected")
        kind, text = self.tokens[self.k]
        self.k += 1
        return ("num", _constant(text)) if kind == "num" else ("ref", text)

    def value(self, tree, noeval: bool = False) -> int:
        """The tree's value. The side bash skips (``0 && X``, ``1 || X``, the branch ``?:`` does
        not take) is still walked with ``noeval``, as bash does: a negative constant exponent there
        is an error; a division by 0 is not, and a variable there reads as 0."""
        kind = tree[0]
        if kind == "num":
            return tree[1]
        if kind == "ref":
            return 0 if noeval else self.ref(tree[1])  # bash does not read a variable it skips
        if kind[0] == "u":
            signs = []
            while tree[0][0] == "u":
                signs.append(tree[0])
                tree = tree[1]
            v = self.value(tree, noeval)
            for sign in reversed(signs):
                v = {"u-": -v, "u+": v, "u!": int(v == 0), "u~": ~v}[sign]
                v = _wrap(v)
            return v
        if kind in ("&&", "||"):
            a = bool(self.value(tree[1], noeval))
            b = bool(self.value(tree[2], noeval or a == (kind == "||")))
            return int(a and b) if kind == "&&" else int(a or b)
        if kind == "?":
            test = bool(self.value(tree[1], noeval))
            yes, no = self.value(tree[2], noeval or not test), self.value(tree[3], noeval or test)
            return yes if test else no
        if kind == ",":
            self.value(tree[1], noeval)
            return self.value(tree[2], noeval)
        a, b = self.value(tree[1], noeval), self.value(tree[2], noeval)
        if kind == "**":
            return _power(a, b)
        try:
            return _binary(kind, a, b)
        except (_ArithError, _Beyond):
            if noeval:
                return 0
            raise


def looks_like_script(path: str, text: str) -> bool:
    """A .sh file, or a file starting with a shell's #! line."""
    return Path(path).suffix in (".sh", ".bash") or bool(re.match(r"#!.*\b(ba|z|da)?sh\b", text))
