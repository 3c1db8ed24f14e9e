"""``custom_dataset`` hooks for the zoo tasks: the generated test splits (deterministic, no
download; see ``lm_eval_sinkmask.zoo.data``) plus a small train split for few-shot use."""

from __future__ import annotations

import itertools


def load_mini_gsm(n_test: int | None = None, **_metadata):
    import datasets

    from lm_eval_sinkmask.zoo import data

    test = data.mini_gsm_test(n_test or data.N_TEST_GSM)
    train = list(itertools.islice(data.mini_gsm_train(seed=0), 100))
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                                 "test": datasets.Dataset.from_list(test)})


def load_mini_code(n_test: int | None = None, **_metadata):
    import datasets

    from lm_eval_sinkmask.zoo import data

    test = data.mini_code_test(n_test or data.N_TEST_CODE)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(test)})
