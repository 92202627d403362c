# $1 is the number of nvshim packages left after this: 0 on erase, 1 on upgrade.
if [ "$1" = 0 ] && command -v systemctl > /dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        systemctl stop nvshim-cdi-refresh.timer nvshim-cdi-refresh.path > /dev/null 2>&1 || true
    fi
    systemctl disable nvshim-cdi-refresh.service nvshim-cdi-refresh.path \
        nvshim-cdi-refresh.timer > /dev/null 2>&1 || true
fi
