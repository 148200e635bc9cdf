"""Tables of realistic wrong answers and unusual correct ones, one module per exercise whose table is long.

Each module defines ``WRONG`` (what the mistake is, the code, a word from the name of the check that must fail) and
``RIGHT`` (what differs, the code); optionally ``judge(number, code, only)`` where the exercise is judged differently
(exercise 11 runs two processes) and ``RIGHT_ONLY`` (the checks a correct alternative is judged on, where some
check cannot be judged on it). tests/test_grading_variants.py runs every row of every table.
"""
