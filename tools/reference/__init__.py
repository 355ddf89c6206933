"""The reference run: this project's own GPU measurements, written into results/ (issue 58:
it serves the project's GPU runs, not a participant, so it lives here, outside the installed
package). From the repository root:

    python3 -m tools.reference --model sdxl --weights random --budget-s 540

    run     the run itself: a ladder into one results folder, a step at a time, resumable
    folder  a reference run's folder: its records, state file and fp32 image
    readme  results/README.md: one table per GPU and model, made from the committed records

Introduced in docs/offline-gpu.md, "On an offline GPU machine".
"""

from .readme import check_results_readme, write_results_readme
from .run import COMMAND, EXIT_BUDGET, ReferenceOutcome, run_reference

__all__ = ["run_reference", "ReferenceOutcome", "write_results_readme", "check_results_readme",
           "EXIT_BUDGET", "COMMAND"]
