"""The engine under abuse, as a user's deployment meets it: `hetspec-chaos` kills its
processes while clients stream (chaos.py), `hetspec-fuzz` sends hostile input to every
surface (fuzz.py, its Hypothesis strategies in fuzz_inputs.py). Each exits 1 on a finding;
the test suite runs both in a short form (tests/test_chaos.py, tests/test_fuzz.py)."""
