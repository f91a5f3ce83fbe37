"""What a secret may be: a name a task's environment can take (none that changes how the
sandbox's programs run), a value of bounded size, and how many a tenant and a task may have.

The gateway checks a secret against these before it stores it (shared/secrets_store.py), and the
runtime checks a stored one's name again before it exports it.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_SECRETS_PER_TASK",
    "MAX_SECRETS_PER_TENANT",
    "MAX_SECRET_BYTES",
    "MIN_SECRET_CHARS",
    "SECRET_NAME_PATTERN",
    "bad_secret_name",
    "bad_secret_value",
]

# A secret reaches a task as an environment variable of that name.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_NAME = re.compile(SECRET_NAME_PATTERN)
# Variables that change how the sandbox's shell, Python, git, ssh or the programs they start
# run (what they load or execute, where they look, how they parse or trace): a secret may not
# set them. The runtime does not export a secret of such a name either, one stored before its
# name was reserved included (services/runtime/task_secrets.py). Names are compared upper-cased.
_RESERVED = frozenset(
    {
        # the shell, bash's own and POSIX ones
        "PATH",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "PWD",
        "OLDPWD",
        "CDPATH",
        "IFS",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "POSIXLY_CORRECT",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "PROMPT_DIRTRIM",
        "GLOBIGNORE",
        "EXECIGNORE",
        "FIGNORE",
        "FUNCNEST",
        "SHLVL",
        "TMOUT",
        "TMPDIR",
        "OPTIND",
        "OPTARG",
        "OPTERR",
        "MAIL",
        "MAILPATH",
        "MAILCHECK",
        "HISTFILE",
        "HISTFILESIZE",
        "HISTSIZE",
        "HISTCONTROL",
        "HISTIGNORE",
        "HISTTIMEFORMAT",
        "HISTCMD",
        "INPUTRC",
        "EMACS",
        "TERM",
        "TERMINFO",
        "TERMINFO_DIRS",
        "TERMCAP",
        "COLUMNS",
        "LINES",
        "HOSTNAME",
        "UID",
        "EUID",
        "PPID",
        "GROUPS",
        "RANDOM",
        "SRANDOM",
        "SECONDS",
        "LINENO",
        "REPLY",
        # programs the shell and git start on their own
        "EDITOR",
        "VISUAL",
        "FCEDIT",
        "PAGER",
        "MANPAGER",
        "LESS",
        "LESSOPEN",
        "LESSCLOSE",
        "LESSKEY",
        "DISPLAY",
        # the C library: locales, modules it loads, name resolution, the allocator
        "LANG",
        "LANGUAGE",
        "LOCPATH",
        "NLSPATH",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "TZ",
        "TZDIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        # other interpreters' start-up code and options
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "PERL5DB",
        "RUBYOPT",
        "RUBYLIB",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        # which certificates TLS trusts (git, pip, curl, Python)
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
_RESERVED_PREFIXES = (
    "DECKHANDS_",  # the system's own
    "BASH_",  # BASH_ENV, BASH_XTRACEFD, BASH_FUNC_*, BASH_COMPAT, ...
    "COMP_",  # bash's completion
    "READLINE_",
    "LC_",  # locale categories
    "LD_",  # the dynamic linker: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
    "MALLOC_",  # glibc's allocator
    "PYTHON",  # PYTHONSTARTUP, PYTHONPATH, PYTHONHOME, PYTHONINSPECT, PYTHONWARNINGS, ...
    "GIT_",  # GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_CONFIG_*, GIT_DIR, GIT_ASKPASS, ...
    "SSH_",  # SSH_ASKPASS, SSH_AUTH_SOCK, ...
    "XDG_",  # XDG_CONFIG_HOME: where git (and others) read their configuration
    "OPENSSL_",  # OPENSSL_CONF loads engines
)
MAX_SECRET_BYTES = 32 << 10  # an environment variable, and one token, key or certificate
MIN_SECRET_CHARS = 4  # a shorter value would be "redacted" out of ordinary output
MAX_SECRETS_PER_TENANT = 200
MAX_SECRETS_PER_TASK = 32


def bad_secret_name(name: str) -> str | None:
    """Why `name` cannot name a secret; None if it can."""
    if not _NAME.fullmatch(name):
        return (
            f"secret name {name!r} is not an environment variable name "
            "(letters, digits and _, not starting with a digit, at most 128 characters)"
        )
    upper = name.upper()
    prefix = next((p for p in _RESERVED_PREFIXES if upper.startswith(p)), None)
    if upper in _RESERVED or prefix is not None:
        which = f"variables starting with {prefix} change" if prefix else f"{upper} changes"
        return (
            f"secret name {name!r} is reserved: {which} how the sandbox's shell, Python, git, "
            "ssh or the programs they start run, so no secret may set it; choose another name"
        )
    return None


def bad_secret_value(value: str) -> str | None:
    """Why `value` cannot be a secret's value; None if it can."""
    if len(value) < MIN_SECRET_CHARS:
        return f"a secret's value has at least {MIN_SECRET_CHARS} characters"
    if len(value.encode()) > MAX_SECRET_BYTES:
        return f"a secret's value has at most {MAX_SECRET_BYTES} bytes"
    if "\x00" in value:
        return (
            "a secret's value cannot contain a NUL character (it becomes an environment variable)"
        )
    return None
