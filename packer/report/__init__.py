"""Reports: what packing saved, computed from the shards.

``accumulate`` turns one packed shard into a mergeable :class:`ShardStats`; ``compute``
merges them and adds the comparisons (padding vs length grouping vs packing, rank
imbalance); ``html`` renders one self-contained page with inline SVG charts.
"""

from packer.report.compute import REPORT_FILES, refresh_report, report, write_report

__all__ = ["REPORT_FILES", "refresh_report", "report", "write_report"]
