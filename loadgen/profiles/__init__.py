"""Engine profiles fitted offline: Vidur's per-operator tables read (vidur_csv), the fit (fit) and `speckv profile fit` (cli)."""
