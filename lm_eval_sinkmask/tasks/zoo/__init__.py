"""lm-eval tasks for the tiny zoo (SPEC section 7): mini_gsm and mini_code, generated offline."""
