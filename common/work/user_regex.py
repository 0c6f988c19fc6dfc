"""User regexes in rules: a per-page time budget, and a check for catastrophic backtracking.

Every pattern a rule names (``path``/``url``, fields' ``regex``, follow ``allow``/``deny``) is
compiled with the ``regex`` module (V0: ``re``'s syntax) by common/work/rules_file.py and
searched through a :class:`RegexBudget`: the page's time left goes in as ``timeout`` and the
GIL is released while it runs (``concurrent=True``), so a backtracking pattern costs at most
RULES_REGEX_TIMEOUT_S of one fetch loop and never the worker's heartbeats (NOTES #51).
:func:`backtracking_risks` warns, at load time and in the checker, about shapes that are
prone to it.
"""

from __future__ import annotations

import logging
import re
import re._constants as sre_constants
import re._parser as sre_parser
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the patterns are compiled by rules_compile, only when rules are set
    import regex

logger = logging.getLogger(__name__)

#: RULES_REGEX_TIMEOUT_S's default (common/core/knobs.py): an ordinary page's rule regexes take
#: microseconds to a few milliseconds together (NOTES.md #35), a hostile one minutes.
REGEX_TIMEOUT_S_DEFAULT = 1.0


class RegexTimeout(TimeoutError):
    """A user regex ran past the page's RULES_REGEX_TIMEOUT_S budget."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"timeout: regex over RULES_REGEX_TIMEOUT_S ({limit_s:g} s)")
        self.limit_s = limit_s


class RegexTimeouts:
    """Searches stopped by the budget since the process started, by where (``field``,
    ``follow``, ``match``): what an operator reads to see user patterns cut (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, where: str) -> None:
        with self._lock:
            self._counts[where] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by where."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


REGEX_TIMEOUTS = RegexTimeouts()


class RegexBudget:
    """The time one page's user regexes may take together (RULES_REGEX_TIMEOUT_S).

    What counts is the time spent searching, summed over the page's searches (rule matching,
    fields, follow rules), not the time since the budget was made: parsing a large page does
    not spend it. Each :meth:`search` passes what is left as the ``regex`` module's
    ``timeout`` and releases the GIL while it matches. Once the budget is spent every further
    search raises at once.
    """

    __slots__ = ("limit_s", "left_s", "timed_out")

    def __init__(self, limit_s: float = REGEX_TIMEOUT_S_DEFAULT) -> None:
        self.limit_s = limit_s
        self.left_s = limit_s
        self.timed_out = False  # some search of this page ran out of time

    def search(self, pattern: regex.Pattern[str], text: str) -> regex.Match[str] | None:
        """``pattern.search(text)`` within the budget; :class:`RegexTimeout` past it."""
        try:
            if self.left_s <= 0:
                raise TimeoutError("the page's regex budget is spent")
            started = time.monotonic()
            try:  # math.inf (no limit) is not a timeout the regex module takes
                return pattern.search(text, timeout=self.left_s if self.left_s < 1e9 else None,
                                      concurrent=True)
            finally:
                self.left_s -= time.monotonic() - started
        except TimeoutError:  # the regex module's, or the spent budget's: the caller decides
            # The regex module's clock and ours differ by a hair: a search it stopped leaves
            # the budget spent, never a few microseconds a later search could use.
            self.left_s = 0.0
            self.timed_out = True
            raise RegexTimeout(self.limit_s) from None


def rule_warnings(rules: Iterable[Any]) -> list[str]:
    """One line per user regex of ``rules`` (common/work/rules_file.py's Rules) that
    :func:`backtracking_risks` finds prone to catastrophic backtracking, naming the rule and
    the field."""
    found = []
    for rule in rules:
        unnamed = re.fullmatch(r"rule \d+", rule.name) is not None  # _rule's default name
        where = f"EXTRACT_RULES {rule.name}" if unnamed else f"EXTRACT_RULES rule {rule.name!r}"
        patterns: list[tuple[str, regex.Pattern[str] | None]] = [
            ("path", rule.path), ("url", rule.url)]
        fields = rule.fields + (rule.items.fields if rule.items is not None else ())
        patterns += [(f"field {f.name!r}", f.regex) for f in fields]
        if rule.follow is not None:
            patterns += [("follow allow", p) for p in rule.follow.allow]
            patterns += [("follow deny", p) for p in rule.follow.deny]
        for label, pattern in patterns:
            if pattern is not None:
                found += [f"{where} {label}: regex {pattern.pattern!r} {risk}"
                          for risk in backtracking_risks(pattern.pattern)]
    return found



# --- Patterns prone to catastrophic backtracking (a heuristic, for warnings only) -----------
#
# The pattern is parsed by re's own parser (a pattern only the regex module reads, e.g. \p{L},
# is not judged) and three shapes are reported; characters are compared on a sample alphabet
# (Latin-1, Latin Extended, a few spaces, digits and letters of other scripts), case flags
# ignored:
# 1. a repetition whose body has a variable width and can end with a character it can also
#    start with: (a+)+, (\d+)*, (\w+\s?)*, (a|aa)+ -- exponential on a long run;
# 2. two unbounded repetitions over overlapping characters with only optional items between:
#    \d+\d+, (\d+)\s*\d+, .*.* -- polynomial;
# 3. a pattern that starts, unanchored (no ^, \A, \b or look-around first), with an unbounded
#    repetition of one character class and goes on with something that can fail:
#    (\d+)\s*USD, \d+\.html$ -- quadratic over a long run of that class, as the search
#    retries at every position of the run. Starting with a literal (/\d+\.html$) or an
#    anchor (^/p/\d+$) avoids it. A possessive or atomic run (\d++, (?>\d+)) still counts here.
# Atomic groups and possessive repetitions do not backtrack: shapes 1 and 2 skip them.

_SAMPLE = frozenset([chr(i) for i in range(0x250)]
                    + list("\u00a0\u2003\u3000\u0660\u0669\u0905\u4e2d\u0416\u03b1"))
_CATEGORIES = {
    sre_constants.CATEGORY_DIGIT: r"\d", sre_constants.CATEGORY_NOT_DIGIT: r"\D",
    sre_constants.CATEGORY_SPACE: r"\s", sre_constants.CATEGORY_NOT_SPACE: r"\S",
    sre_constants.CATEGORY_WORD: r"\w", sre_constants.CATEGORY_NOT_WORD: r"\W",
}
_CATEGORY_CHARS = {code: frozenset(c for c in _SAMPLE if re.fullmatch(cls, c))
                   for code, cls in _CATEGORIES.items()}
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
_GROUPS = (sre_constants.SUBPATTERN, sre_constants.ATOMIC_GROUP)
_ONE_CHAR = (sre_constants.LITERAL, sre_constants.NOT_LITERAL, sre_constants.ANY,
             sre_constants.IN)
_ZERO_WIDTH = (sre_constants.AT, sre_constants.ASSERT, sre_constants.ASSERT_NOT)
_UNBOUNDED = sre_constants.MAXREPEAT
Item = tuple[Any, Any]


def backtracking_risks(pattern: str) -> list[str]:
    """What makes ``pattern`` prone to catastrophic backtracking (empty: nothing seen).

    A heuristic over the parsed pattern (the comment above lists its three shapes): it finds
    the usual mistakes, not every slow pattern, and a warning is advice, not an error.
    """
    try:
        items = list(sre_parser.parse(pattern).data)
    except (re.error, ValueError, OverflowError, RecursionError):
        # Not re's syntax (a regex-module extension such as \p{L}): not judged, not an error.
        logger.debug("pattern %.200r not checked for backtracking: re cannot parse it", pattern)
        return []
    risks: list[str] = []
    _walk(items, risks)
    if _unanchored_run(items):
        risks.append("starts, unanchored, with a repeated character class followed by more "
                     "pattern: on a long run of that class the search retries at every "
                     "position (quadratic time); anchor it (^) or start with a literal")
    return list(dict.fromkeys(risks))


def _walk(items: list[Item], risks: list[str]) -> None:
    """Shapes 1 and 2 in a sequence and everything nested in it."""
    for n, (op, av) in enumerate(items):
        if op in _REPEATS:
            low, high, body = av
            body = list(body)
            width = sre_parser.SubPattern(sre_parser.State(), body).getwidth()
            if ((high == _UNBOUNDED or (high > 1 and width[1] >= _UNBOUNDED))
                    and width[0] != width[1] and _first(body)[0] & _last(body)[0]):
                risks.append("repeats a group of variable width whose end can begin its next "
                             "repetition, e.g. (a+)+ or (\\d+)*: exponential backtracking "
                             "on a long run")
            _walk(body, risks)
        elif op == sre_constants.SUBPATTERN:
            _walk(list(av[3]), risks)
        elif op == sre_constants.BRANCH:
            for alternative in av[1]:
                _walk(list(alternative), risks)
        if _is_run(op, av) is not None:
            chars = _is_run(op, av)
            for later_op, later_av in items[n + 1:]:
                later = _is_run(later_op, later_av)
                if later is not None and later & chars:
                    risks.append("has two unbounded repetitions over overlapping characters "
                                 "with nothing required between them, e.g. \\d+\\d+: "
                                 "polynomial backtracking")
                    break
                if not _first([(later_op, later_av)])[1]:
                    break  # a required item separates them


def _is_run(op: Any, av: Any, *, possessive: bool = False) -> frozenset[str] | None:
    """The characters of an unbounded repetition of one character (through groups), else
    None; ``possessive``: atomic groups and possessive repetitions count too."""
    while (op == sre_constants.SUBPATTERN and len(av[3]) == 1) or (
            possessive and op == sre_constants.ATOMIC_GROUP and len(av) == 1):
        op, av = av[3][0] if op == sre_constants.SUBPATTERN else av[0]
    repeats = _REPEATS + ((sre_constants.POSSESSIVE_REPEAT,) if possessive else ())
    if op in repeats and av[1] == _UNBOUNDED and len(av[2]) == 1 and av[2][0][0] in _ONE_CHAR:
        return _chars(*av[2][0])
    return None


def _unanchored_run(items: list[Item]) -> bool:
    """Shape 3: a leading unbounded one-character repetition, then something that can fail."""
    sequence = items
    while sequence and sequence[0][0] == sre_constants.SUBPATTERN:
        sequence = list(sequence[0][1][3]) + sequence[1:]  # a group's items, then the rest
    # No backtracking inside a possessive run, but the search still retries at each position.
    if not sequence or _is_run(*sequence[0], possessive=True) is None:
        return False
    rest = sequence[1:]
    return any(op in _ZERO_WIDTH or not _first([(op, av)])[1] for op, av in rest)


def _first(items: list[Item]) -> tuple[frozenset[str], bool]:
    """The characters ``items`` can start with, and whether they can match nothing."""
    chars: frozenset[str] = frozenset()
    for op, av in items:
        own, empty = _item_ends(op, av, _first)
        chars |= own
        if not empty:
            return chars, False
    return chars, True


def _last(items: list[Item]) -> tuple[frozenset[str], bool]:
    """The characters ``items`` can end with, and whether they can match nothing."""
    chars: frozenset[str] = frozenset()
    for op, av in reversed(items):
        own, empty = _item_ends(op, av, _last)
        chars |= own
        if not empty:
            return chars, False
    return chars, True


def _item_ends(op: Any, av: Any, ends: Callable[[list[Item]], tuple[frozenset[str], bool]]
               ) -> tuple[frozenset[str], bool]:
    if op in _ONE_CHAR:
        return _chars(op, av), False
    if op in _REPEATS or op == sre_constants.POSSESSIVE_REPEAT:
        chars, empty = ends(list(av[2]))
        return chars, empty or av[0] == 0
    if op == sre_constants.SUBPATTERN:
        return ends(list(av[3]))
    if op == sre_constants.ATOMIC_GROUP:
        return ends(list(av))
    if op == sre_constants.BRANCH:
        chars, empty = frozenset(), False
        for alternative in av[1]:
            own, own_empty = ends(list(alternative))
            chars, empty = chars | own, empty or own_empty
        return chars, empty
    return frozenset(), True  # anchors, look-arounds, group references: nothing to compare


def _chars(op: Any, av: Any) -> frozenset[str]:
    """The sample characters one character item matches."""
    if op == sre_constants.LITERAL:
        return frozenset([chr(av)])
    if op == sre_constants.NOT_LITERAL:
        return _SAMPLE - {chr(av)}
    if op == sre_constants.ANY:
        return _SAMPLE - {"\n"}
    chars: set[str] = set()
    negate = False
    for sub_op, sub_av in av:
        if sub_op == sre_constants.NEGATE:
            negate = True
        elif sub_op == sre_constants.LITERAL:
            chars.add(chr(sub_av))
        elif sub_op == sre_constants.RANGE:
            chars.update(c for c in _SAMPLE if sub_av[0] <= ord(c) <= sub_av[1])
        elif sub_op == sre_constants.CATEGORY:
            chars |= _CATEGORY_CHARS.get(sub_av, _SAMPLE)
        else:  # RANGE_UNI_IGNORE, CHARSET, BIGCHARSET (compiled forms): assume anything
            chars |= _SAMPLE
    return _SAMPLE - chars if negate else frozenset(chars)
