"""The engine: ``schedule -> run -> update`` one step at a time, the model runner that turns a
``SchedulerOutput`` into a forward pass and sampled tokens, and ``build_engine``, which assembles all
of it from a composed config with Hydra's ``instantiate``.

The top of the stack below the entry points (``forge.llm``, ``forge.main``, ``forge.server``): it may
import every package under it, and none of them imports it."""
