package compactor.readcheck;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Schema;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.data.IdentityPartitionConverters;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetReaders;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.mapping.NameMapping;
import org.apache.iceberg.mapping.NameMappingParser;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.PartitionUtil;

/**
 * Reads the live rows of a table's current state the way Iceberg's engine readers (Spark's,
 * Flink's) read Parquet files: through the table's name mapping ({@code
 * schema.name-mapping.default}) for files without field ids, identity partition values as
 * constants. {@code IcebergGenerics} reads such files without the mapping (by column
 * position), so this is the reference for imported files. Data files only: the table must have
 * no delete files. Prints one canonical row ({@link IcebergReadCheck#canon}) a line.
 *
 * <p>Usage: {@code NameMappedRead <metadata.json location>} (local tables).
 */
public final class NameMappedRead {
  private NameMappedRead() {}

  public static void main(String[] args) throws Exception {
    String location = args[0];
    Table table =
        new BaseTable(
            new StaticTableOperations(location, IcebergReadCheck.fileIO(location, Map.of())),
            "mapped");
    Schema schema = table.schema();
    String json = table.properties().get(TableProperties.DEFAULT_NAME_MAPPING);
    NameMapping mapping = json == null ? null : NameMappingParser.fromJson(json);
    Types.StructType struct = schema.asStruct();
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    try (CloseableIterable<FileScanTask> tasks = table.newScan().planFiles()) {
      for (FileScanTask task : tasks) {
        if (!task.deletes().isEmpty() || task.file().format() != FileFormat.PARQUET) {
          throw new IllegalStateException("not a plain Parquet data file: " + task.file().location());
        }
        Map<Integer, ?> constants =
            PartitionUtil.constantsMap(task, IdentityPartitionConverters::convertConstant);
        Parquet.ReadBuilder read =
            Parquet.read(table.io().newInputFile(task.file().location()))
                .project(schema)
                .createReaderFunc(
                    fileSchema -> GenericParquetReaders.buildReader(schema, fileSchema, constants));
        if (mapping != null) {
          read = read.withNameMapping(mapping);
        }
        try (CloseableIterable<Record> records = read.build()) {
          for (Record record : records) {
            StringBuilder row = new StringBuilder("[");
            for (int i = 0; i < struct.fields().size(); i++) {
              if (i > 0) {
                row.append(',');
              }
              IcebergReadCheck.canon(row, struct.fields().get(i).type(), record.get(i));
            }
            out.println(row.append(']'));
          }
        }
      }
    }
    out.flush();
  }
}
