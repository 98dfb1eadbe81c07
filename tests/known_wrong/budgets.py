"""Known-wrong submissions for The three budgets in numbers: roofline, memory per rank, and the 4D mesh: the bugs students really make, as edits of the reference.

TODO: the signature check and the mistakes students make (the scaffold's placeholders: a textbook loop over
rows that keeps `compute` and loses `signature`, and two plain bugs).
"""

from tests.known_wrong import Mutant

MUTANTS = [
    Mutant(
        name="textbook",
        why="TODO: the textbook computation, the same numbers without the technique (placeholder: I summed the rows "
            "one by one in a Python loop)",
        edits=[("    return x.sum(dim=-1)\n",
                "    return torch.stack([row.sum() for row in x]) if len(x) else x.sum(dim=-1)\n")],
        loses=["signature"],
        keeps=["compute"],
    ),
    Mutant(
        name="wrong_dim",
        why="TODO: a mistake students make (placeholder: I summed over the rows instead of along them)",
        edits=[("return x.sum(dim=-1)", "return x.sum(dim=0)")],
        loses=["compute_public", "compute"],
    ),
    Mutant(
        name="first_column_dropped",
        why="TODO: a mistake students make (placeholder: I started each row's sum at its second element)",
        edits=[("return x.sum(dim=-1)", "return x[:, 1:].sum(dim=-1)")],
        loses=["compute_public", "compute"],
    ),
]
