"""A process may write its own memory through /proc/self/mem (id() gives an object's address): every
probe in the worker is then the student's to rewrite. The default rules flag the path; the structural
rules flag open() itself, since the path can be built at run time."""
# expect: '/proc/self/mem'
def poke(obj, data):
    with open("/proc/self/" + "mem", "r+b", buffering=0) as mem:
        mem.seek(id(obj))
        mem.write(data)
