#!/usr/bin/env bash
# Installs the headless browser the checkout kit's browser test drives: Debian's
# chromium package at /usr/bin/chromium. Only from the distribution's packages, as root
# (as CI runs): the test never downloads a browser build of its own.
#
# Idempotent: when /usr/bin/chromium is already there it exits at once.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  echo "chromium already installed at $CHROMIUM"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "error: $CHROMIUM is missing; run $0 as root (it runs apt-get install chromium)" >&2
  exit 1
fi

# Noninteractive: CI has no standard input for a package's questions.
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y chromium

"$CHROMIUM" --version
echo "installed at $CHROMIUM"
