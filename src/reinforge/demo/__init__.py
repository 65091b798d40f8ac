"""The calc demo: Calc-X-style arithmetic with a calculator tool, its warm start, and `reinforge demo`."""
