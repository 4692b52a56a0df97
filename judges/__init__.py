"""judges: everything that scores (rule verifiers and model judges); imports neither marl nor trainers."""
