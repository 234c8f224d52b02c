"""The trainer's data pipeline, from corpus files to the batches a step trains on, one file a stage:

    download    fetch a named corpus (WikiText-2/103), checksums verified
    corpus      read documents and paragraphs from text files (plain, .xz, .gz), split sentences
    sentences   split a corpus into sentences on every core, once, into a cache file
    tokens      token ids of the sentences in memory-mapped caches, per (corpus, tokenizer)
    pipeline    from --corpus and --eval-corpus to those caches and a tokenizer (`prepare`)
    prepare     the pipeline alone, without training: `python -m trainer.data.prepare`
    examples    next-sentence pairs drawn from the token caches, in bounded memory
    masking     dynamic masked-LM masking, drawn afresh each time a batch is used
    batches     batches built ahead, in this process or a worker process
"""
