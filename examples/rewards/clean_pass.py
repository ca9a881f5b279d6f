"""A reward built on the exec result: full credit only when every test passed and the code has
no `print` left; the exec reward's run is reused, nothing runs again. None (not applicable)
for a task without tests.

    reward.functions: [examples/rewards/clean_pass.py:clean_pass@0.5]
"""

import re

PRINT = re.compile(r"\bprint\s*\(")


def clean_pass(code: str, exec_result: dict | None) -> dict | None:
    if not exec_result or not exec_result["total"]:
        return None
    all_passed = exec_result["passed"] == exec_result["total"]
    no_print = PRINT.search(code) is None
    return {"score": float(all_passed and no_print), "all_passed": float(all_passed),
            "no_print": float(no_print)}
