# lantern-pipeline: neighbour tables -> generation sweeps -> metrics -> tables -> figures.
from snakemake.utils import min_version

min_version("9.0")


configfile: f"{workflow.basedir}/config/config.yaml"


report: f"{workflow.basedir}/workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/toy.smk"


rule all:
    input:
        all_outputs(),
    default_target: True
