"""The Ray backend (`train.backend: ray`): rollout workers, versioned weight broadcast, the cluster.

    cluster.py   connect to (or start) the cluster; one-line errors for an unreachable address or
                 missing resources
    worker.py    RolloutWorker: a Ray actor holding copies of the run's actors, playing episodes and
                 their counterfactual replays with the one episode engine (marl.rollout)
    gates.py     EndpointGate: one concurrency cap and rate limit per judge endpoint for the cluster
    player.py    RayPlayer: the driver's drop-in for EpisodePlayer; splits jobs over the workers,
                 ships changed weights with a version number, replays a dead worker's jobs

Everything distributed is Ray's (actors, the object store); this package only decides what goes where.
Sampling is keyed by (episode seed, turn, agent, position) (marl.rollout.turn_key), so where an
episode is played never changes what is sampled: the Ray backend reproduces the local one.

May import: marl (the episode engine), trainers.policy (actors), judges.model (endpoint limits); ray and cloudpickle inside functions only.
"""
