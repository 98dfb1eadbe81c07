# Never returns.
def online_normalizer(chunks):
    while True:
        pass


def merge_states(m_a, l_a, m_b, l_b):
    while True:
        pass


def online_softmax(x, block_size=1024):
    while True:
        pass


def softmax_triton(x):
    while True:
        pass
