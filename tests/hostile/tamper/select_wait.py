"""select() with no descriptors and a timeout: a sleep without the time module."""
# expect: select
# clocks
import select


def pad(seconds):
    select.select([], [], [], seconds)
