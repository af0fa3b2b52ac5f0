"""Spot fleets: the job files `thrifty launch` writes from a thrifty config.

`request` holds what `thrifty launch` asks for (`LaunchRequest`); `launching` runs it;
`job` turns the config and the request into a `FleetJob`; `skypilot` and `slurm` write
it as each engine's own job description, every value quoted (`shell`) and every secret
passed in an environment variable instead (`credentials`); `wheel` ships the running thrifty
to SkyPilot's machines; `files` writes them, replacing only what launch wrote; `agent` is
what runs on every node (torch's elastic agent, ending 75 when the job was preempted);
`cost` prints the planner's estimate first.
Importing this package is cheap: no torch.
"""
