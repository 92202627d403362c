# $1 is the number of nvshim packages left: 0 on erase, 1 on upgrade.
if [ "$1" = 0 ]; then
    for link in /usr/bin/nvidia-cdi-hook /usr/bin/nvidia-container-runtime-hook; do
        if [ -L "$link" ] && [ "$(readlink "$link")" = nvshim-hook ]; then
            rm -f "$link"
        fi
    done
fi
# On erase the node spec nvshim wrote goes too (its hooks name /usr/bin/nvshim-hook, now gone);
# specs of other producers are not touched.
if [ "$1" = 0 ] && grep -qs /usr/bin/nvshim-hook /var/run/cdi/nvidia.yaml; then
    rm -f /var/run/cdi/nvidia.yaml
fi
