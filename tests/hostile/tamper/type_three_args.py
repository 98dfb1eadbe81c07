"""type(name, bases, namespace) defines a finaliser under a computed name: code that runs at garbage
collection, between the calls the probes watch."""
# expect: type(name, bases, namespace)
def later(work, name):
    Holder = type("Holder", (), {name: lambda self: work()})
    return Holder()
