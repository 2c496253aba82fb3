#!/usr/bin/env bash
# Install Debian packages without starting their services (no systemd here):
# a policy-rc.d that forbids service starts during post-install.
set -euo pipefail
policy=/usr/sbin/policy-rc.d
had_policy=0; [ -e "$policy" ] && had_policy=1
if [ $had_policy -eq 0 ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; fi
trap '[ $had_policy -eq 0 ] && rm -f "$policy"' EXIT
missing=()
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
