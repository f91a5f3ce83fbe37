"""The shell scripts the workspace helpers run (workspace_helper.py): a repository's checkout,
an uploaded tree's baseline, the diff, and the repository instructions read back.

`git` here works on files the tenant controls: the agent can write `.git/config` (a clean
filter, `core.fsmonitor`, `diff.external`, hooks, `include`...) and so can a repository or an
upload. So git never opens a git directory of the workspace as a repository: `dh_repo` makes
/tmp/g, a git directory of the helper's own whose configuration is written here, and gives it
only the workspace's data (objects, through GIT_OBJECT_DIRECTORY; HEAD, refs and the index,
copied). No setting the workspace holds is ever read, so none can name a command; attributes in
the tree may name filters or diff drivers, but with no configuration defining them git applies
none. Submodules are ignored (git would otherwise run itself in them, reading their
configuration). The helper's environment keeps system and global configuration out
(workspace_helper._GIT_ENV).

`.deckhands/` is the runtime's own (an uploaded tree's baseline): an upload may not carry it
(workspace_archive.py), each upload writes it anew, and what is read back from it is data only.
"""

from __future__ import annotations

from .checkout import START_REF
from .workspace_archive import STATE_DIR

__all__ = [
    "INSTRUCTION_FILES",
    "checkout_script",
    "diff_script",
    "parse_instructions",
    "upload_script",
]

INSTRUCTION_FILES = ("AGENTS.md", ".openhands/microagents/repo.md")
_MARK = "@@deckhands-instructions "
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_BASELINE = f"{STATE_DIR}/baseline.git"
_GIT = "git -c safe.directory='*' -c user.name=deckhands -c user.email=deckhands@localhost"
_DIFF = "diff --no-ext-diff --no-textconv --no-color --binary --ignore-submodules=all"

# dh_repo SRC: /tmp/g over SRC's data (a directory, not a link). Files that hold settings
# (config, config.worktree, hooks/, info/attributes, commondir) are never copied. An index is
# copied with its time: git takes a file written in the index's own second as possibly
# changed ("racily clean"), and a copy made now would hide an edit of the same size made in the
# second of the checkout.
_PREAMBLE = r"""
CP="cp --preserve=timestamps"
dh_repo() {
  src=/workspace/$1
  { [ -d "$src" ] && [ ! -L "$src" ] && [ -d "$src/objects" ]; } || return 1
  rm -rf /tmp/g && mkdir -p /tmp/g/refs /tmp/g/info || return 1
  printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n' > /tmp/g/config
  for f in HEAD packed-refs index info/exclude "$src"/sharedindex.*; do
    f=${f#"$src"/}
    if [ -f "$src/$f" ] && [ ! -L "$src/$f" ]; then $CP "$src/$f" "/tmp/g/$f" || return 1; fi
  done
  [ -f /tmp/g/HEAD ] || echo 'ref: refs/heads/main' > /tmp/g/HEAD
  if [ -d "$src/refs" ] && [ ! -L "$src/refs" ]; then
    cp -R "$src/refs/." /tmp/g/refs/ || return 1
  fi
  export GIT_DIR=/tmp/g GIT_WORK_TREE=/workspace GIT_OBJECT_DIRECTORY="$src/objects"
}
"""


def _instructions_script(max_bytes: int) -> str:
    files = " ".join(INSTRUCTION_FILES)
    return (
        f'for f in {files}; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
        f'printf \'{_MARK}%s\\n\' "$f"; head -c {max_bytes} "$f"; break; fi; done'
    )


def checkout_script(max_bytes: int) -> str:
    """The fetched `.git` (copied into /workspace) written out as the tree; then the
    instructions."""
    return (
        _PREAMBLE
        + "dh_repo .git || exit 1\n"
        + f"{_GIT} reset -q --hard HEAD || exit 1\n"
        + "$CP /tmp/g/index /workspace/.git/index || exit 1\n"
        + _instructions_script(max_bytes)
    )


def upload_script(max_bytes: int) -> str:
    """A workspace without a repository: the uploaded tree becomes the baseline the diff
    compares with, written anew in `.deckhands/` (objects, the index, HEAD as a commit id)."""
    return (
        _PREAMBLE
        + "if [ ! -e .git ]; then\n"
        + f"  chmod -R u+rwx {STATE_DIR} 2>/dev/null; rm -rf {STATE_DIR}\n"
        + f"  mkdir -p {_BASELINE}/objects && dh_repo {_BASELINE} || exit 1\n"
        + f"  echo '/{STATE_DIR}/' > /tmp/g/info/exclude\n"
        + f"  {_GIT} add -A . && {_GIT} commit -q --allow-empty -m 'uploaded tree' || exit 1\n"
        + f"  $CP /tmp/g/index {_BASELINE}/index && {_GIT} rev-parse HEAD > {_BASELINE}/HEAD"
        + " || exit 1\n"
        + "fi\n"
        + _instructions_script(max_bytes)
    )


def diff_script() -> str:
    """The workspace against its start: the repository's start ref (else HEAD), or the
    uploaded tree's baseline; untracked files as new ones. Exit 3: nothing to compare with."""
    return (
        _PREAMBLE
        + "if [ -e .git ]; then\n"
        + '  dh_repo .git || { echo "the workspace\'s .git is not a git directory" >&2;'
        + " exit 3; }\n"
        + f"  b=$({_GIT} rev-parse -q --verify '{START_REF}^{{commit}}' || "
        + f"{_GIT} rev-parse -q --verify 'HEAD^{{commit}}' || echo {_EMPTY_TREE})\n"
        + f"elif [ -d {_BASELINE} ]; then\n"
        + f"  dh_repo {_BASELINE} || exit 1; b=HEAD\n"
        + f"  echo '/{STATE_DIR}/' >> /tmp/g/info/exclude\n"
        + "else echo 'the workspace holds no repository and no uploaded tree to compare with' >&2;"
        + " exit 3; fi\n"
        + f'{_GIT} {_DIFF} "$b" -- || exit 1\n'
        + f"{_GIT} ls-files -z --others --exclude-standard | while IFS= read -r -d '' f; do\n"
        + f'  {_GIT} {_DIFF} --no-index -- /dev/null "$f"; [ $? -le 1 ] || exit 1\n'
        + "done\n"
    )


def parse_instructions(out: bytes) -> tuple[str, str] | None:
    """(path, text) of the instructions a script printed, if it found any."""
    text = out.decode("utf-8", "replace")
    if not text.startswith(_MARK):
        return None
    head, _, body = text.partition("\n")
    return head[len(_MARK) :].strip(), body
