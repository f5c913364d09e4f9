from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Invoice",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("number", models.CharField(max_length=40)),
                ("slot", models.DateTimeField()),
                ("token", models.BigIntegerField()),
                ("pid", models.IntegerField()),
            ],
        ),
    ]
