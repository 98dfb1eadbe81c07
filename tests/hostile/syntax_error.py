def online_softmax(x, block_size=1024:
    return x
