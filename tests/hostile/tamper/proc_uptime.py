"""/proc/uptime is a clock: read it with open(), with the path built from pieces."""
# expect: '/proc/uptime'
# clocks
def now():
    with open("/pr" + "oc/upt" + "ime") as f:
        return float(f.read().split()[0])
