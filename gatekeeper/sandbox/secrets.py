"""Names of files and folders that hold credentials; hidden inside the sandbox wherever they are."""

from __future__ import annotations

import re
from fnmatch import translate
from functools import lru_cache

# Matched against a file or folder's own name.
SECRET_NAMES = (
    ".env", ".env.*", "*.env",
    ".netrc", "_netrc", ".git-credentials", ".git-credential-cache",
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store",
    ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc", ".pgpass", ".my.cnf",
    ".terraformrc", ".vault-token", ".boto", ".s3cfg",
    "id_rsa", "id_rsa.*", "id_dsa", "id_ecdsa", "id_ecdsa.*", "id_ed25519", "id_ed25519.*",
    "credentials.toml",  # cargo registry tokens (~/.cargo/credentials.toml)
    "gcloud",  # ~/.config/gcloud
)  # fmt: skip

# Files under /etc that hold host secrets, readable by root.
ETC_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/security/opasswd",
    "/etc/gitconfig",  # system git config may name credential helpers
    "/etc/ssl/private", "/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_dsa_key", "/etc/docker",
    "/etc/sudoers.d", "/etc/pki/private",
)  # fmt: skip


def is_secret_name(name: str, extra: tuple[str, ...] = ()) -> bool:
    """True when a file or folder called name may hold credentials."""
    if name == ".env.example" or name == ".env.sample" or name == ".env.template":
        return False
    return _names_expression(extra).match(name) is not None


@lru_cache(maxsize=64)
def _names_expression(extra: tuple[str, ...]) -> re.Pattern[str]:
    """SECRET_NAMES and extra as one expression, matched as fnmatchcase matches each of them
    (the mount plan asks it of every file of the worktree)."""
    return re.compile("|".join(f"(?:{translate(p)})" for p in (*SECRET_NAMES, *extra)))
