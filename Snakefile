# lantern-pipeline: neighbour tables -> generation sweeps -> metrics -> tables -> figures.
from snakemake.utils import min_version

min_version("9.0")


configfile: f"{workflow.basedir}/config/config.yaml"


report: f"{workflow.basedir}/workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/drafter.smk"
include: "workflow/rules/llamagen.smk"
include: "workflow/rules/chameleon.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/metrics.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/proximity.smk"


localrules:
    tables,
    figure,
    figure_samples,
    figure_ambiguity,
    figure_proximity,


rule all:
    input:
        all_outputs(),
    default_target: True
