#!/usr/bin/env bash
# Writes ember(1) from the command's own texts: `ember --help` (commands, exit status) and
# `ember help --man`, each command's section written from the option table that its --help
# and its parser use, so the page never drifts from them.
# Usage: scripts/gen_manpage.sh path/to/ember OUT.1   (the build runs it: build/ember.1)
set -euo pipefail
ember="$1"; out="$2"
# roff: a backslash is \e, a line starting with . or ' is protected by \&, - is \- (options)
roff() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/-/\\-/g'; }
version="$("$ember" --version | head -1 | sed 's/^ember //')"
commands="$("$ember" --help | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && $1 != "" && $1 != "help" {print $1}')"
[ -n "$commands" ] || { echo "gen_manpage: no commands in '$ember --help'" >&2; exit 1; }
sections="$("$ember" help --man)"
for c in $commands; do   # a command without a section would be a command without a table
    # the section's title is roff: a - in a command's name is written \-
    grep -qxF ".SS ember ${c//-/\\-}" <<<"$sections" || { echo "gen_manpage: no section for ember $c" >&2; exit 1; }
done
{
    echo ".TH EMBER 1 \"\" \"ember $version\" \"User Commands\""
    echo ".nh"   # option names are not hyphenated across lines
    echo ".SH NAME"
    echo "ember \\- PyTorch's device model in C: devices, training, evaluation, benchmarks, memory estimates"
    echo ".SH SYNOPSIS"
    echo ".B ember"
    echo "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]"
    echo ".br"
    echo ".B ember help"
    echo "\\fICOMMAND\\fR"
    echo ".br"
    echo ".B ember"
    echo "\\fB\\-\\-version\\fR | \\fB\\-\\-help\\fR"
    echo ".SH DESCRIPTION"
    echo ".nf"
    "$ember" --help | sed '/^exit status:/,$d' | roff
    echo ".fi"
    echo ".SH COMMANDS"
    # each command's section from its option table (tools/ember/options.c), as --help is
    printf '%s\n' "$sections"
    echo ".SH EXIT STATUS"
    echo ".nf"
    "$ember" --help | sed -n '/^exit status:/,$p' | tail -n +2 | roff
    echo ".fi"
    echo ".SH ENVIRONMENT"
    echo ".TP"
    echo ".B EMBER_DEVICE"
    echo "the device auto\\-selection uses (cpu, cuda:N, opencl:N)"
    echo ".SH SEE ALSO"
    echo "The headers in include/ember/ and the API reference (scripts/docs.sh)."
} >"$out.tmp"
mv "$out.tmp" "$out"
