"""The README and docs/ stay true to the code and to each other.

The README is the five-minute introduction; the reference lives in docs/, one page per subject.
These checks keep that layout from rotting: every setting a service reads is documented once in
docs/configuration.md, every link between the pages resolves, and the README stays short.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from pydantic_settings import BaseSettings

from services.controller.settings import ControllerSettings
from services.gateway.settings import GatewaySettings
from services.reasoner.settings import ReasonerSettings
from services.runtime.settings import RuntimeSettings
from services.security.settings import SecuritySettings
from services.storage.settings import StorageSettings
from shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
README_MAX_LINES = 300

SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    CommonSettings,
    GatewaySettings,
    ControllerSettings,
    ReasonerSettings,
    SecuritySettings,
    RuntimeSettings,
    StorageSettings,
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_VARIABLE = re.compile(r"DECKHANDS_[A-Z0-9_]*[A-Z0-9]")
# [text](target) and ![alt](target); the text may hold code spans but no brackets.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _environment_names(settings: type[BaseSettings]) -> set[str]:
    """The variables one settings class reads: its env_prefix plus the field's name, upper
    case (pydantic-settings' default, case-insensitive), unless the field names its own
    variable with an alias or a validation_alias (then the prefix does not apply)."""
    prefix = str(settings.model_config.get("env_prefix") or "")
    names: set[str] = set()
    for field_name, field in settings.model_fields.items():
        aliases = [
            alias for alias in (field.validation_alias, field.alias) if isinstance(alias, str)
        ]
        # AliasChoices: every plain name among the choices is a variable the class reads.
        choices = getattr(field.validation_alias, "choices", [])
        aliases += [choice for choice in choices if isinstance(choice, str)]
        if aliases:
            names.update(alias.upper() for alias in aliases if alias)
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names


def _settings_variables() -> set[str]:
    """The DECKHANDS_* variables of every settings class (the ones docs/configuration.md
    documents; an alias outside that namespace would need a page of its own)."""
    variables: set[str] = set()
    for settings in SETTINGS_CLASSES:
        variables |= _environment_names(settings)
    return {name for name in variables if name.startswith("DECKHANDS_")}


def _outside_code_blocks(text: str) -> list[str]:
    """The lines of a markdown file that are not inside a fenced code block."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _named_in_configuration_tables(text: str) -> Counter[str]:
    """How many table rows of docs/configuration.md name each variable. A row names the
    variables written in its first cell (`| DECKHANDS_X, DECKHANDS_Y | default | ... |`); the
    other cells may mention a variable as a cross-reference without counting."""
    named: Counter[str] = Counter()
    for line in _outside_code_blocks(text):
        if not line.lstrip().startswith("|"):
            continue
        cells = line.strip().strip("|").split("|")
        named.update(set(_VARIABLE.findall(cells[0])))
    return named


def test_every_setting_has_exactly_one_row_in_the_configuration_page() -> None:
    """An operator looks a variable up in docs/configuration.md: a setting without a row is
    invisible to them, and one with two rows will sooner or later say two different things."""
    named = _named_in_configuration_tables(CONFIGURATION.read_text(encoding="utf-8"))
    variables = _settings_variables()
    missing = sorted(v for v in variables if named[v] == 0)
    repeated = sorted(f"{v} ({named[v]} rows)" for v in variables if named[v] > 1)
    assert not missing and not repeated, (
        f"docs/configuration.md must give each settings variable one table row; "
        f"missing: {missing or 'none'}; repeated: {repeated or 'none'}"
    )


def test_the_settings_are_found() -> None:
    """A guard on the check above: it must see the variables the services really read."""
    variables = _settings_variables()
    assert {"DECKHANDS_NATS_URL", "DECKHANDS_LLM_MODEL", "DECKHANDS_SANDBOX_MEMORY"} <= variables
    assert len(variables) > 100


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation other
    than '-' and '_' dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, a repeated one suffixed -1, -2 as GitHub
    does."""
    seen: Counter[str] = Counter()
    anchors: set[str] = set()
    for line in _outside_code_blocks(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        anchors.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _broken_links(path: Path) -> list[str]:
    broken: list[str] = []
    for line in _outside_code_blocks(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: ({target})"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where}: no heading with that anchor")
    return broken


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    """Pages moved out of the README and headings renamed break links silently on GitHub; a
    relative link must name a file that exists and an anchor one of its headings."""
    broken = [link for path in _markdown_files() for link in _broken_links(path)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_listed_in_the_index() -> None:
    """docs/README.md is where a reader finds a page: a page missing from it is lost."""
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    listed = {Path(target.partition("#")[0]).name for target in _LINK.findall(index)}
    pages = {path.name for path in DOCS.glob("*.md")} - {"README.md"}
    assert not pages - listed, f"docs/README.md does not link: {sorted(pages - listed)}"


def test_the_readme_stays_short() -> None:
    """The README is read in five minutes; the reference belongs in docs/."""
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (under {README_MAX_LINES} wanted): move reference "
        "material to a page of docs/"
    )
