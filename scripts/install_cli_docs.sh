#!/usr/bin/env bash
# Installs memdiag's man page and shell completions (generated from the parser by
# scripts/cli_docs.py, kept in docs/) where man and the shells look; scripts/setup.sh runs it.
# DESTDIR puts the tree under another root (tests/unit/test_cli_docs.py installs into a temporary
# one). Prints one line per file it changed; quiet when all are in place.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
root="${DESTDIR:-}"
# bash-completion loads /usr/share/bash-completion/completions/NAME on demand; without it, the
# older /etc/bash_completion.d is sourced at shell start
bash_dir="$root/usr/share/bash-completion/completions"
if [ ! -d "$bash_dir" ] && [ -d "$root/etc/bash_completion.d" ]; then
    bash_dir="$root/etc/bash_completion.d"
fi
targets=(
    "docs/man/memdiag.1:$root/usr/local/share/man/man1/memdiag.1"
    "docs/completion/memdiag.bash:$bash_dir/memdiag"
    "docs/completion/_memdiag:$root/usr/local/share/zsh/site-functions/_memdiag"
)
for pair in "${targets[@]}"; do
    src="$here/${pair%%:*}"
    dst="${pair#*:}"
    if ! cmp -s "$src" "$dst"; then
        install -D -m 644 "$src" "$dst"
        echo "setup: installed $dst"
    fi
done
