"""lm-eval tasks for the tiny zoo (SPEC section 7): mini_gsm, mini_code and mini_mc, generated offline."""
