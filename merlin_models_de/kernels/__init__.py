"""The optimizers' row kernels: what a table's update does to the rows it touches.

- :mod:`.rounding`: stochastic rounding of 16-bit tables, seeded by the table's name;
- :mod:`.scatter`: a table's sparse row updates on a CPU (adds in pieces, Adagrad's rows
  gathered, updated and written back);
- :mod:`.rowwise`: optimizers with one state value per table row (``RowWiseAdagrad``).
"""
