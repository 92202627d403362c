# $1 is the number of nvshim packages left: 0 on erase, 1 on upgrade.
if [ "$1" = 0 ]; then
    for link in /usr/bin/nvidia-cdi-hook /usr/bin/nvidia-container-runtime-hook; do
        if [ -L "$link" ] && [ "$(readlink "$link")" = nvshim-hook ]; then
            rm -f "$link"
        fi
    done
fi
