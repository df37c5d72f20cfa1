import dedup


def test_public_api_is_frozen():
    assert sorted(dedup.__all__) == sorted(
        [
            "DedupConfig",
            "DedupResult",
            "find_duplicates",
            "minhash_signatures",
            "normalize_text",
            "shingles",
            "word_shingle_hash32",
            "char_shingle_hash32",
            "choose_bands",
            "local_cluster",
            "tune_worker_malloc",
        ]
    )
    for name in dedup.__all__:
        assert getattr(dedup, name).__doc__


def test_config_round_trips_to_json_params():
    params = dedup.DedupConfig(threshold=0.7, verify="signature").to_dict()
    assert params["threshold"] == 0.7 and params["verify"] == "signature"
    assert dedup.DedupConfig(**params) == dedup.DedupConfig(threshold=0.7, verify="signature")
