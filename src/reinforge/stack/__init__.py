"""The served stack: what serves the policy and how the store and gateway are put on the network,
assembled once for the trainer, the SFT recording and `reinforge store serve`.

- `settings.py`: `EngineSettings`, what serves the policy (`[trainer.engine]`, `store serve`'s options).
- `backends.py`: `build_serving`, settings -> the `Backend`, the embedded engine and the `WeightSync`.
- `weight_sync/`: one `WeightSync` per backend, moving it to each new policy version.
- `app.py`: `StackApp`, the store app with the gateway at `GATEWAY_MOUNT`; `ServedStack` serves it.
- `join.py`: the gateway secret in the run folder, and the command a runner joins with.
- `cli.py`: `reinforge store serve`.

Nothing is imported here: `reinforge store serve` must start without torch.
"""
