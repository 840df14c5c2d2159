# bash completion for the ember command (installed as share/bash-completion/completions/ember).
# The commands come from `ember --help` and each command's options from `ember help COMMAND`,
# so completion follows the help texts of the ember being completed.
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
        [ "$COMP_CWORD" -eq 2 ] && mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
        return
    fi
    case "$prev" in
        --device) mapfile -t COMPREPLY < <(compgen -W "auto cpu cuda cuda:0 cuda:1 opencl opencl:0 opencl:1" -- "$cur"); return ;;
        --dtype) mapfile -t COMPREPLY < <(compgen -W "f32 f16 bf16 f64" -- "$cur"); return ;;
        --optimizer|--optim) mapfile -t COMPREPLY < <(compgen -W "adam adamw sgd sgd-momentum" -- "$cur"); return ;;
        --mode) mapfile -t COMPREPLY < <(compgen -W "all inference full lora" -- "$cur"); return ;;
    esac
    if [[ "$cur" == -* ]]; then
        local opts
        opts="$("$ember" help "$cmd" 2>/dev/null | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)"
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -f -- "$cur") # checkpoints, data folders
    fi
}
complete -o default -F _ember ember
