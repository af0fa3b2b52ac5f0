"""How a model is spread over processes, and the processes themselves: one strategy per variant,
behind one interface (`base.Strategy`; `choice.make_strategy` picks one): `single.py` (one process),
`ddp.py` (a replica per rank), `fsdp.py` (parameters, gradients and optimizer state sharded).
`process_group.py` is the job's process group and the host-side agreement the loop needs,
`timeouts.py` its collective timeouts, `elastic.py` a resume at another world size;
`device.py` picks this process's device and its CPUs; `launcher.py` starts the processes of
`--nprocs` on one machine. Importing the package imports none of them (nor torch).
"""
