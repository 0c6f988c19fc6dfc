"""Settings groups of what is done with a page: crawl mode, extraction and user code, the WARC
archive, per-page bounds, and the back-pressure that slows workers down.

Each field is declared once with :func:`~common.core.settings.declare.setting`: its variable,
parser, default text (parsed: the field's default) and meaning (the configuration reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.core import values
from common.core.settings.declare import SettingsGroup, setting


@dataclass(frozen=True, repr=False)
class CrawlSettings(SettingsGroup):
    """Crawl mode: which extracted links are followed."""

    crawl_enabled: bool = setting(
        "CRAWL_ENABLED", values.boolean, "false",
        "Crawl mode: workers enqueue the links they extract (through the producer path).")
    crawl_max_depth: int = setting(
        "CRAWL_MAX_DEPTH", values.non_negative_int, "2",
        "Links are followed while the new depth stays at or below this (seeds are depth 0).")
    crawl_allowed_domains: str = setting(
        "CRAWL_ALLOWED_DOMAINS", values.text, "",
        "Comma-separated domains links may go to (and their subdomains); empty: the "
        "page's own host only.")
    crawl_max_pages: int = setting(
        "CRAWL_MAX_PAGES_PER_DOMAIN", values.positive_int, "10000",
        "Pages crawl mode may enqueue per domain (counted in Redis, fleet-wide).")
    crawl_nofollow: bool = setting(
        "CRAWL_NOFOLLOW", values.boolean, "true",
        "Crawl mode honours `rel=\"nofollow\"` links and robots `nofollow` (meta tag, "
        "`X-Robots-Tag`); a follow rule's `nofollow` overrides it.")


@dataclass(frozen=True, repr=False)
class ExtractSettings(SettingsGroup):
    """What a page's record holds: its size cap, the extraction rules and user code, and their
    limits."""

    max_record_bytes: int = setting(
        "MAX_RECORD_BYTES", values.positive_int, "65536",
        "Largest result record (JSON bytes); a longer one loses links first, then its `data`, "
        "then its longest fields, and is flagged `record_truncated`.")
    extract_rules: str = setting(
        "EXTRACT_RULES", values.rules_ref, "",
        "Extraction rules: `@rules.yml`, `@rules.json` or inline JSON; the values go into "
        "each matching page's record under `data`. Validated at worker start. Empty: none.")
    extractor: str = setting(
        "EXTRACTOR", values.text, "",
        "User extraction function `package.module:function`, called on each HTML page after "
        "the rules; its `data` wins over theirs. Imported at worker start. Empty: none.")
    handlers: str = setting(
        "HANDLERS", values.text, "",
        "Your handlers: `package.module:router`, a `scrape_fleet.Router`, or several "
        "comma-separated (the first is the default job's; a job's `handlers:` names one of "
        "them; each must import at worker start); on each HTML page, "
        "after the rules, the handler its label, rule or URL pattern names runs (see "
        "HANDLER_ISOLATION). Imported at worker start; not with EXTRACTOR. Empty: none.")
    handler_timeout_s: float = setting(
        "HANDLER_TIMEOUT_S", values.positive_float, "2",
        "A handler or EXTRACTOR call taking longer is stopped (its child killed; inline: "
        "interrupted) and `data_errors.handler` (`.extractor`) starts with `timeout:`.")
    handler_max_memory_bytes: int = setting(
        "HANDLER_MAX_MEMORY_BYTES", values.positive_int, "536870912",
        "Address space of each user-code child process (RLIMIT_AS); past it the call fails "
        "(`crashed:`) and a fresh child takes the next page.")
    handler_processes: int = setting(
        "HANDLER_PROCESSES", values.positive_int, "2",
        "User-code child processes (HANDLERS or EXTRACTOR) per fetch loop: a page waiting for "
        "its handler lets the loop's other pages go on, and up to this many of its pages run "
        "user code at once (~46 MiB each at rest).")
    handler_isolation: str = setting(
        "HANDLER_ISOLATION", values.choice("process", "inline"), "process",
        "process: user code runs in child processes (time and memory limits, a hang or crash "
        "costs one page). inline: on the worker's own tree in its thread, ~2x cheaper per "
        "page; only Python-level time limits, a hang in C code restarts the worker (docs: "
        "handlers, Isolation).")
    rules_regex_timeout_s: float = setting(
        "RULES_REGEX_TIMEOUT_S", values.positive_float, "1",
        "Time a page's extraction-rule regexes (`path`/`url`, fields' `regex`, follow "
        "`allow`/`deny`) may take together; past it the field is null with `timeout` in "
        "`data_errors`, the rest of the page's links are not followed (`data_errors.follow`).")


@dataclass(frozen=True, repr=False)
class ArchiveSettings(SettingsGroup):
    """The WARC archive of fetched responses."""

    archive: str = setting(
        "ARCHIVE", values.choice("none", "warc"), "none",
        "warc: every fetched response (any status, not cache hits) is kept as it was "
        "transferred, with its request, in gzip WARC 1.1 files under ARCHIVE_DIR; the result "
        "names the file and offset (`archive`). none: pages are not kept.")
    archive_dir: str = setting(
        "ARCHIVE_DIR", values.text, "archive",
        "Directory of the WARC files (one writer per worker; `NAME.warc.gz.open` while "
        "written, `NAME.warc.gz` once closed).")
    archive_max_bytes: int = setting(
        "ARCHIVE_MAX_BYTES", values.positive_int, "1073741824",
        "A WARC file is closed and a new one started once it would pass this size.")
    archive_fsync: bool = setting(
        "ARCHIVE_FSYNC", values.boolean, "false",
        "fsync the WARC file before each result is stored (survives a power loss, not only "
        "a killed worker), at the cost of a disk flush per page.")
    archive_keep_cookies: bool = setting(
        "ARCHIVE_KEEP_COOKIES", values.boolean, "false",
        "Keep Cookie and Set-Cookie values in the WARC records as they went over the wire "
        "(faithful replay, but the files then hold live session secrets); by default each "
        "value is replaced by `[redacted]`.")


@dataclass(frozen=True, repr=False)
class PageLimitSettings(SettingsGroup):
    """Bounds on one page and one delivery: links kept, tags parsed, and the deaths and parse
    time before its URL is `poison`."""

    record_max_links: int = setting(
        "RECORD_MAX_LINKS", values.non_negative_int, "1000",
        "Links kept in a result record (crawl mode still follows every link it extracted).")
    max_page_tags: int = setting(
        "MAX_PAGE_TAGS", values.positive_int, "100000",
        "Tags (`<`) of a page parsed; the rest is cut and the record says `truncated: tags`.")
    poison_deliveries: int = setting(
        "POISON_DELIVERIES", values.positive_int, "3",
        "Deliveries of a URL that ended without an outcome (its worker died) before it is "
        "dead-lettered as `poison`.")
    stuck_page_s: float = setting(
        "STUCK_PAGE_S", values.positive_float, "30",
        "A page still parsing after this long marks its URL `poison` and restarts the worker "
        "(at least HANDLER_TIMEOUT_S + RULES_REGEX_TIMEOUT_S + 5 s).")


@dataclass(frozen=True, repr=False)
class PressureSettings(SettingsGroup):
    """Back-pressure: when workers stop taking deliveries, and take them again."""

    redis_memory_high: float = setting(
        "REDIS_MEMORY_HIGH", values.fraction, "0.9",
        "Workers stop taking deliveries while Redis uses more than this fraction of its "
        "maxmemory (no maxmemory: never).")
    redis_memory_low: float = setting(
        "REDIS_MEMORY_LOW", values.fraction, "0.8",
        "...and take them again below this fraction.")
    results_backlog_high: int = setting(
        "RESULTS_BACKLOG_HIGH", values.positive_int, "80000",
        "Workers stop taking deliveries while a registered sink has more unwritten results "
        "and failure records than this...")
    results_backlog_low: int = setting(
        "RESULTS_BACKLOG_LOW", values.positive_int, "40000",
        "...and take them again below this.")
    pressure_check_s: float = setting(
        "PRESSURE_CHECK_S", values.positive_float, "1",
        "How often a worker reads Redis memory and the sinks' backlog.")
