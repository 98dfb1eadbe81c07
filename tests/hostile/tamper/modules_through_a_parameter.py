"""sys.modules read off a parameter (the caller passes sys in): an attribute the scan cannot resolve."""
# expect: ...modules
def harness(s, name):
    return s.modules[name]
