# gexmk for Cython users: `from gexmk cimport rma, core, memory`.
