"""counterfactory plug-ins: each module registers one (the entry points name them)."""
