"""marl: torch-free core (tasks; scenarios, environments and credit assignment to come)."""
