"""The simulator fitted to a launched server (`tune --presearch sim`): the design of its runs, the fits of each cost
family, the presearch that tunes on the fit and relaunches its best, and its report."""
