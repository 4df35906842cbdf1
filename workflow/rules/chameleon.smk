# The Chameleon-family world (world: chameleon; Anole, Lumina-mGPT): the prompt table from the configured prompt set
# (row i captions image i of every sweep point). Its target, drafter, tokenizer and VQGAN are the released files,
# read by the generate jobs (`lantern sample --family`); its neighbour table is the neighbours rule's, from the
# VQGAN's codebook. The rule exists in every world (profiles name it); only a chameleon run asks for its output.


rule chameleon_prompts:
    output:
        f"{OUT}/chameleon/prompts.csv",
    log:
        f"{OUT}/logs/chameleon/prompts.log",
    params:
        source=chameleon_prompt_source(),
        n=config["sweep"]["n_images"],
    conda:
        "../../environment.yml"
    shell:
        "lantern chameleon-prompts {params.source} --n {params.n} --out {output:q} > {log:q} 2>&1"
