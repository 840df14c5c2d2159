# bash completion for the ember command (installed as share/bash-completion/completions/ember).
# The commands come from `ember --help` and each command's options, with their kinds and
# choices, from `ember help --options COMMAND` (the table its parser and --help use), so
# completion follows the ember being completed.
_ember() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" ember="${COMP_WORDS[0]}"
    local commands
    commands="$("$ember" --help 2>/dev/null | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && $1 != "" {print $1}')"
    if [ "$COMP_CWORD" -eq 1 ]; then
        mapfile -t COMPREPLY < <(compgen -W "$commands --help --version" -- "$cur")
        return
    fi
    local cmd="${COMP_WORDS[1]}"
    if [ "$cmd" = help ]; then
        [ "$COMP_CWORD" -eq 2 ] && mapfile -t COMPREPLY < <(compgen -W "$commands --options --man" -- "$cur")
        [ "$COMP_CWORD" -eq 3 ] && [[ "$prev" == --* ]] && mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
        return
    fi
    # ember train --model gpt has a table of its own
    local selector=("$cmd") i
    if [ "$cmd" = train ]; then
        for ((i = 2; i < COMP_CWORD; i++)); do
            if [ "${COMP_WORDS[i]}" = --model=gpt ] || { [ "${COMP_WORDS[i]}" = --model ] && [ "${COMP_WORDS[i+1]}" = gpt ]; }; then
                selector+=(--model gpt)
                break
            fi
        done
    fi
    local table
    table="$("$ember" help --options "${selector[@]}" 2>/dev/null)"
    # the value of the option before the cursor: its choices, a device, a file
    local row
    row="$(awk -F'\t' -v o="$prev" '$1 == o || $2 == o {print; exit}' <<<"$table")"
    if [ -n "$row" ]; then
        local kind choices
        kind="$(cut -f3 <<<"$row")"
        choices="$(cut -f8 <<<"$row")"
        case "$kind" in
            flag) ;;
            choice) mapfile -t COMPREPLY < <(compgen -W "${choices//,/ }" -- "$cur"); return ;;
            device) mapfile -t COMPREPLY < <(compgen -W "auto cpu cuda cuda:0 cuda:1 opencl opencl:0 opencl:1" -- "$cur"); return ;;
            int|double|size) COMPREPLY=(); return ;;
            list)
                case "$prev" in
                    --dtype) mapfile -t COMPREPLY < <(compgen -W "f32 f16 bf16 f64" -- "$cur") ;;
                    --only) mapfile -t COMPREPLY < <(compgen -W "matmul copy launch crossover" -- "$cur") ;;
                    --devices) mapfile -t COMPREPLY < <(compgen -W "cpu opencl:0 opencl:1 cuda:0 cuda:1" -- "$cur") ;;
                    *) COMPREPLY=() ;;
                esac
                return ;;
            *) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;   # paths, names
        esac
    fi
    if [[ "$cur" == -* ]]; then
        local opts
        opts="$(awk -F'\t' '$7 !~ /hidden/ {print $1; if ($2 != "-") print $2}' <<<"$table")"
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -f -- "$cur") # checkpoints, data folders
    fi
}
complete -o default -F _ember ember
